"""Moving between token sequences and feature maps without copying.

Tokens are kept as a contiguous (B, H * W, C) tensor, which is the memory of a channels-last (B, C, H, W) map:
the convolutions (patch embedding, spatial reduction, PEG) run on that view directly and hand back
channels-last maps, which read back as tokens without a copy.
"""

import torch
import torch.nn.functional as F

from ..compat import is_compiling, is_fx_tracing, is_in_onnx_export


def symbolic_shapes() -> bool:
    """True while torch.compile, torch.export, ONNX export, TorchScript tracing or torch.fx symbolic tracing
    records the model: a shape-dependent Python branch must not be taken then."""
    return is_compiling() or torch.jit.is_tracing() or is_in_onnx_export() or is_fx_tracing()


def tokens_to_map(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(B, H * W, C) tokens -> (B, C, H, W) map, a channels-last view when ``x`` is contiguous."""
    B, _, C = x.shape
    return x.reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) map -> (B, H * W, C) tokens, a view when the map is channels-last."""
    B, C, H, W = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, H * W, C)


def pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero-pad a map bottom/right so that H and W are multiples of ``multiple``.

    While a graph is being recorded the pad is always applied (possibly by zero): one graph serves every input
    size."""
    # A ceiling division of non-negative sizes (ONNX's truncating division agrees): a ``%`` form nests one
    # symbolic expression per stage and slows every trace (docs/reliability.md).
    h, w = x.shape[-2:]
    pad_h, pad_w = (h + multiple - 1) // multiple * multiple - h, (w + multiple - 1) // multiple * multiple - w
    if symbolic_shapes() or pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def pad_to_at_least(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad a map bottom/right so that H and W are at least ``size`` (a kernel = stride = ``size``
    convolution without padding then gives one cell where the map is smaller); unchanged otherwise. While a
    graph is being recorded the pad is always applied (by zero where the map is large enough), its amount
    symbolic in the size (``_below``)."""
    h, w = x.shape[-2:]
    pad_h, pad_w = (size - h) * _below(h, size), (size - w) * _below(w, size)
    if symbolic_shapes() or pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def _below(n, size: int):
    """1 where ``n`` (>= 1) is below ``size``, else 0, by floor divisions of non-negative numbers alone (which
    torch.export, ONNX and OpenVINO take without fixing a size)."""
    # (size - 1) // n is 0 for n >= size and within 1..size - 1 below it.
    return ((size - 1) // n + size) // (size + 1)
