"""Patch embedding (non-overlapping, or overlapping as PVTv2's) that accepts any input size."""
from collections.abc import Callable

import torch
from torch import nn

from .layout import map_to_tokens, pad_to_multiple


class PatchEmbed(nn.Module):
    """Conv(kernel = stride = patch) + LayerNorm, after zero-padding the input bottom/right to a multiple of
    the patch size, so an H x W input gives a ceil(H / p) x ceil(W / p) token map (as mmseg's 'corner'
    padding) and no input is too small. With an odd ``kernel_size`` larger than the patch size the patches
    overlap (PVTv2's): the convolution pads kernel_size // 2 on every side, which gives the same ceil(H / p) x
    ceil(W / p) map. Keys ``proj`` and ``norm`` as in the official weights; the norm is
    ``norm_layer(dim)`` at its default eps; DeiT-style columnar models have none (``norm_layer=None``).

    Takes a (B, C, H, W) map in either memory format and runs the convolution channels-last: the tokens are
    then a view of its output (``layers.layout``); an NCHW image is converted first (why: docs/performance.md)."""

    def __init__(self, in_chans: int, dim: int, patch_size: int,
                 norm_layer: Callable[..., nn.Module] | None = nn.LayerNorm, kernel_size: int | None = None):
        super().__init__()
        kernel_size = patch_size if kernel_size is None else kernel_size
        if kernel_size != patch_size and (kernel_size < patch_size or kernel_size % 2 == 0):
            raise ValueError(f'an overlapping patch embedding needs an odd kernel_size larger than the patch size '
                             f'{patch_size}, got {kernel_size}')
        self.patch_size = patch_size
        self.overlap = kernel_size > patch_size
        self.proj = nn.Conv2d(in_chans, dim, kernel_size, stride=patch_size, padding=kernel_size // 2 * self.overlap)
        self.norm = norm_layer(dim) if norm_layer is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = x.contiguous(memory_format=torch.channels_last)
        x = self.proj(x if self.overlap else pad_to_multiple(x, self.patch_size))
        return self.norm(map_to_tokens(x)), (x.shape[-2], x.shape[-1])
