"""Moving between token sequences and feature maps without copying.

Tokens are kept as a contiguous (B, H * W, C) tensor, which is the memory of a channels-last (B, C, H, W) map:
the convolutions (patch embedding, spatial reduction, PEG) run on that view directly and hand back
channels-last maps, which read back as tokens for free. Twins/timm transpose to contiguous NCHW and back
instead, one copy of the activations each way.
"""
from typing import Tuple

import torch
import torch.nn.functional as F

from .fused import symbolic_shapes


def tokens_to_map(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """(B, H * W, C) tokens -> (B, C, H, W) map, a channels-last view when ``x`` is contiguous."""
    B, _, C = x.shape
    return x.reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) map -> (B, H * W, C) tokens, a view when the map is channels-last."""
    B, C = x.shape[:2]
    return x.permute(0, 2, 3, 1).reshape(B, -1, C)


def pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero-pad a map bottom/right so that H and W are multiples of ``multiple``.

    While a graph is being recorded the pad is always applied (possibly by zero), so that one graph serves
    every input size instead of one per divisibility case. (Sizes stay non-negative in the arithmetic: ONNX's
    integer division truncates where Python's floors.)"""
    pad_h, pad_w = (multiple - x.shape[-2] % multiple) % multiple, (multiple - x.shape[-1] % multiple) % multiple
    if symbolic_shapes() or pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x
