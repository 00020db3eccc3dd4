"""The fixed 2-D sin-cos position table (Transformer frequencies per axis, as MAE and timm build it)."""
import torch

from .base import HW, Geometry, PositionEncoding, grid_coordinates, sincos_angles


def sincos_table(hw: HW, dim: int, temperature: float = 10000., device=None) -> torch.Tensor:
    """(h * w, dim): a quarter of the channels each for sin and cos of the column, then of the row, at
    ``dim // 4`` frequencies 1 / temperature ** (i / (dim // 4)); positions in tokens from the top-left."""
    rows, cols = grid_coordinates(hw, device=device)
    num = dim // 4
    ax, ay = sincos_angles(cols, num, temperature), sincos_angles(rows, num, temperature)
    return torch.cat((ax.sin(), ax.cos(), ay.sin(), ay.cos()), dim=1)


class SinCosEncoding(PositionEncoding):
    """``sincos``: the fixed 2-D sin-cos table of the input's own token grid added after each stage's patch
    embedding (no parameters; computed for any grid, so nothing is resized: a larger grid continues the
    table). Positions count tokens from the top-left; a class token gets none. Widths must be multiples of 4."""
    attr = 'pos_sincos'
    name = 'sincos'

    def __init__(self, geometry: Geometry, temperature: float = 10000.):
        super().__init__(geometry)
        bad = [d for d in geometry.dims if d % 4]
        if bad:
            raise ValueError(f'sincos needs widths that are multiples of 4, got {list(geometry.dims)}')
        if not temperature > 1:
            raise ValueError(f'sincos temperature must be > 1, got {temperature!r}')
        self.temperature = float(temperature)

    def embed(self, stage: int, x: torch.Tensor, hw: HW, region) -> torch.Tensor:
        table = sincos_table(hw, x.shape[-1], self.temperature, x.device).to(x.dtype)
        prefix = self.geometry.num_prefix_tokens if stage == 0 else 0
        if prefix:
            return torch.cat((x[:, :prefix], x[:, prefix:] + table), dim=1)
        return x + table


__all__ = ['SinCosEncoding', 'sincos_table']
