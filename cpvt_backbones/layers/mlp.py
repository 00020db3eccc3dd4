"""Feed-forward layers that see the token grid."""
from collections.abc import Callable

import torch
from torch import nn

from .layout import map_to_tokens, tokens_to_map
from .position.base import check_odd_kernel
from .valid import WHOLE, Region


class ConvMlp(nn.Module):
    """PVTv2's convolutional feed-forward (arXiv 2106.13797): ``fc2(act(dwconv(fc1(x))))``, where ``dwconv`` is a
    ``kernel_size`` x ``kernel_size`` depthwise convolution (zero padding, with bias) over the hidden tokens laid
    out as their (h, w) map; dropout after the activation and after ``fc2``. Keys ``fc1``, ``dwconv``, ``fc2``.

    ``takes_grid = True``: a ``Block`` calls it as ``mlp(x, hw, region)`` with the token map's size ``hw`` and its
    region (``layers.valid``). The last h * w tokens are the map; tokens before them (a class token) pass through
    ``fc1``, the activation and ``fc2`` without the convolution. On a padded batch's ``ValidRegion`` the hidden
    map is zeroed beyond each image before the convolution, so each image's convolution sees zeros beyond its
    border, as alone. ``extra_relu``: a ReLU after ``fc1`` (PVTv2-li's).

    Parameters: ``2 * dim * hidden_dim + hidden_dim * (kernel_size ** 2 + 2) + dim``.
    """
    takes_grid = True

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0., act_layer: Callable[..., nn.Module] = nn.GELU,
                 kernel_size: int = 3, extra_relu: bool = False):
        super().__init__()
        check_odd_kernel(kernel_size, 'kernel_size')
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.relu = nn.ReLU() if extra_relu else nn.Identity()
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, kernel_size, padding=kernel_size // 2, groups=hidden_dim)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], region: Region = WHOLE) -> torch.Tensor:
        x = region.zero_tokens(self.relu(self.fc1(x)))
        prefix = x.shape[1] - hw[0] * hw[1]
        grid = map_to_tokens(self.dwconv(tokens_to_map(x[:, prefix:], hw)))
        x = torch.cat((x[:, :prefix], grid), dim=1) if prefix else grid
        return self.drop(self.fc2(self.drop(self.act(x))))


__all__ = ['ConvMlp']
