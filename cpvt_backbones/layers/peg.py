"""Positional Encoding Generator (PEG), the conditional positional encoding of CPVT."""
from typing import Tuple

import torch
from torch import nn

from .layout import map_to_tokens, tokens_to_map

PEG_TYPES = ('depthwise', 'separable')


class PEG(nn.Module):
    """Adds a zero-padded convolution of the token map to the tokens.

    The tokens are laid back out as a (B, C, H, W) map; a k x k depthwise convolution with zero padding k // 2
    sees the image border through its padding, which is what lets it encode absolute position, and it works at
    any H x W because it is conditioned on the input rather than on a table of fixed length. Leading prefix
    tokens (a class token) bypass it.

    ``peg_type='separable'`` follows the depthwise convolution with a pointwise one (the paper's
    "separable convolution" variant). The layers live in ``proj`` (a Sequential) so that official Twins/CPVT
    and timm weights load under their key names (``proj.0.*``).
    """

    def __init__(self, dim: int, kernel_size: int = 3, peg_type: str = 'depthwise'):
        super().__init__()
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool):
            raise TypeError(f'peg_kernel_size must be an int, got {kernel_size!r}')
        if kernel_size < 3 or kernel_size % 2 == 0:
            raise ValueError(
                f'peg_kernel_size must be odd and >= 3 (zero padding k // 2 keeps the map size), got {kernel_size}')
        if peg_type not in PEG_TYPES:
            raise ValueError(f'peg_type must be one of {PEG_TYPES}, got {peg_type!r}')
        layers = [nn.Conv2d(dim, dim, kernel_size, 1, kernel_size // 2, groups=dim)]
        if peg_type == 'separable':
            layers.append(nn.Conv2d(dim, dim, 1))
        self.proj = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], num_prefix_tokens: int = 0) -> torch.Tensor:
        feat = tokens_to_map(x[:, num_prefix_tokens:], hw)
        out = map_to_tokens(self.proj(feat) + feat)
        if num_prefix_tokens:
            out = torch.cat((x[:, :num_prefix_tokens], out), dim=1)
        return out
