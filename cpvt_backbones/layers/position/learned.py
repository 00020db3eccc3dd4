"""A learned absolute position table (DeiT, PVT), resized to the input's token grid."""
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..layout import map_to_tokens, symbolic_shapes, tokens_to_map
from .base import HW, Geometry, PositionEncoding

INTERPOLATIONS = ('bicubic', 'bilinear')


def resize_table(table: torch.Tensor, grid: HW, hw: HW, mode: str = 'bicubic') -> torch.Tensor:
    """A (1, gh * gw, C) table for a ``grid`` resized to (1, h * w, C) for ``hw``, as timm resamples DeiT's
    table for another image size (align_corners=False, antialiased when shrinking). At ``hw == grid`` the
    result equals the table (the kernel then samples the grid points themselves)."""
    gh, gw = grid
    table = table.reshape(1, gh, gw, -1).permute(0, 3, 1, 2)
    table = F.interpolate(table, size=hw, mode=mode, align_corners=False, antialias=True)
    return table.flatten(2).transpose(1, 2)


class LearnedEncoding(PositionEncoding):
    """``learned``: a table per stage, added to the tokens after the patch embedding, learned for the token
    grid of an ``img_size`` input (int or (h, w); per stage ceil(img_size / stride)) and resized
    (``interpolation``: 'bicubic' as DeiT/timm, or 'bilinear' as PVT) to any other grid. A class token has
    its own entry. On a padded batch each image gets the table resized to its own grid. Keys
    ``pos_embed.{stage}`` (1, prefix + gh * gw, C); initialised N(0, 0.02) truncated."""
    attr = 'pos_embed'
    name = 'learned'

    def __init__(self, geometry: Geometry, img_size: int | tuple[int, int] = 224,
                 interpolation: str = 'bicubic'):
        super().__init__(geometry)
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if len(size) != 2 or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in size):
            raise ValueError(f'learned img_size must be a positive int or (h, w), got {img_size!r}')
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f'learned interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}')
        self.img_size, self.interpolation = size, interpolation
        self.grids = [tuple((n + s - 1) // s for n in size) for s in geometry.strides]
        for stage, (dim, (gh, gw)) in enumerate(zip(geometry.dims, self.grids)):
            prefix = geometry.num_prefix_tokens if stage == 0 else 0
            table = nn.Parameter(torch.zeros(1, prefix + gh * gw, dim))
            nn.init.trunc_normal_(table, std=.02)
            self.register_parameter(str(stage), table)

    def table(self, stage: int) -> nn.Parameter:
        return getattr(self, str(stage))

    def embed(self, stage: int, x: torch.Tensor, hw: HW, region) -> torch.Tensor:
        table = self.table(stage)
        prefix = self.geometry.num_prefix_tokens if stage == 0 else 0
        grid = table[:, prefix:]
        if region.padded:  # each image's own grid: the table resized to it, placed top-left
            grid = torch.stack([F.pad(tokens_to_map(self._resized(stage, grid, size), size)[0],
                                      (0, hw[1] - size[1], 0, hw[0] - size[0])) for size in region.images()])
            grid = map_to_tokens(grid)
        else:
            grid = self._resized(stage, grid, hw)
        return x + (torch.cat((table[:, :prefix].expand(grid.shape[0], -1, -1), grid), dim=1) if prefix else grid)

    def _resized(self, stage: int, grid: torch.Tensor, hw: HW) -> torch.Tensor:
        """The stage's table for an ``hw`` grid: itself at its own grid (always resized in a traced graph, whose
        sizes are symbolic)."""
        if not symbolic_shapes() and tuple(hw) == self.grids[stage]:
            return grid
        return resize_table(grid, self.grids[stage], hw, self.interpolation)

    def parts_of(self, stage: int, blocks: Sequence[int], embedding: bool = False) -> list[nn.Parameter]:
        return [self.table(stage)] if embedding else []

    def cut(self, kept_depths: Sequence[int]) -> list[str]:
        dropped = [i for i in range(len(self.grids)) if i >= len(kept_depths) or not kept_depths[i]]
        for i in dropped:
            delattr(self, str(i))
        self.grids = self.grids[:len(self.grids) - len(dropped)]
        return [str(i) for i in dropped]

    def extra_repr(self) -> str:
        return f'learned ({self.grids[0][0]}x{self.grids[0][1]} grid, {self.interpolation})'


__all__ = ['INTERPOLATIONS', 'LearnedEncoding', 'resize_table']
