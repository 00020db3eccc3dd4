"""Non-overlapping patch embedding that accepts any input size."""
from collections.abc import Callable

import torch
from torch import nn

from .layout import map_to_tokens, pad_to_multiple


class PatchEmbed(nn.Module):
    """Conv(kernel = stride = patch) + LayerNorm, after zero-padding the input bottom/right to a multiple of
    the patch size, so an H x W input gives a ceil(H / p) x ceil(W / p) token map (as mmseg's 'corner'
    padding) and no input is too small. Keys ``proj`` and ``norm`` as in the official weights; the norm is
    ``norm_layer(dim)`` at its default eps (1e-5 for ``nn.LayerNorm``, as those weights were trained);
    DeiT-style columnar models have none (``norm_layer=None``).

    Takes a (B, C, H, W) map in either memory format and runs the convolution channels-last: the tokens are
    then a view of its output (``layers.layout``); an NCHW image is converted first (why: docs/performance.md)."""

    def __init__(self, in_chans: int, dim: int, patch_size: int,
                 norm_layer: Callable[..., nn.Module] | None = nn.LayerNorm):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)
        self.norm = norm_layer(dim) if norm_layer is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.proj(pad_to_multiple(x.contiguous(memory_format=torch.channels_last), self.patch_size))
        return self.norm(map_to_tokens(x)), (x.shape[-2], x.shape[-1])
