"""2-D rotary position embedding for vision transformers (Heo et al., ECCV 2024): axial and mixed."""
import math
from collections.abc import Sequence

import torch
from torch import nn

from .base import HW, AttentionPosition, Geometry, PositionEncoding, Rotary, grid_coordinates, uniform_magnitudes


def mixed_frequencies(head_dim: int, heads: int, temperature: float, angle: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """(2, heads, head_dim // 2) frequencies over (column, row): the first half of a head's channel pairs
    turns along the direction ``angle`` (per head), the second half along ``angle + pi / 2``, at RoPE's
    magnitudes. ``angle`` None gives 0: the first half along columns, the second along rows (RoPE-Axial)."""
    mag = uniform_magnitudes(head_dim, temperature).expand(heads, -1)
    if angle is None:
        zero = torch.zeros_like(mag)
        return torch.stack((torch.cat((mag, zero), dim=1), torch.cat((zero, mag), dim=1)))
    angle = angle.reshape(heads, 1)
    fx = torch.cat((mag * torch.cos(angle), mag * torch.cos(angle + math.pi / 2)), dim=1)
    fy = torch.cat((mag * torch.sin(angle), mag * torch.sin(angle + math.pi / 2)), dim=1)
    return torch.stack((fx, fy))


def rotary_angles(freqs: torch.Tensor, hw: HW, step: float = 1.) -> torch.Tensor:
    """(heads, h * w, head_dim // 2) angles column * fx + row * fy for the tokens of an ``hw`` grid whose
    tokens are ``step`` units apart (see ``base.grid_coordinates``)."""
    rows, cols = grid_coordinates(hw, step, freqs.device)
    f = freqs.float()
    return cols[None, :, None] * f[0][:, None, :] + rows[None, :, None] * f[1][:, None, :]


class RoPEEncoding(PositionEncoding):
    """``rope_axial`` / ``rope_mixed``: queries and keys of every block rotate by angles linear in the token's
    (column, row), so a query-key logit depends on their offset only; the residual stream carries no position.

    * ``rope_axial``: fixed frequencies, half of each head's channel pairs along columns, half along rows,
      ``temperature`` 100 (RoPE-Axial; timm ``vit_small_patch16_rope_224``). No parameters.
    * ``rope_mixed``: learned frequencies per block and head over both axes at once, initialised at a random
      direction per head, ``temperature`` 10 (RoPE-Mixed; timm ``vit_small_patch16_rope_mixed_224``). Keys
      ``rope.freqs.{k}`` (2, heads, head_dim // 2) for block k in network order.

    Positions are token indices from the top-left; keys of a map reduced ``sr`` times sit at their cells'
    centres in query-token units. Class tokens are not rotated. Head widths must be multiples of 4.
    """
    attr = 'rope'
    name = 'rope_mixed'
    learnable = True
    default_temperature = 10.

    def __init__(self, geometry: Geometry, temperature: float | None = None):
        super().__init__(geometry)
        temperature = self.default_temperature if temperature is None else float(temperature)
        if not temperature > 1:
            raise ValueError(f'{self.name} temperature must be > 1, got {temperature!r}')
        self.temperature = temperature
        geometry.check_key_grid(self.name)
        head_dims = [d // h for d, h in zip(geometry.dims, geometry.heads)]
        if any(hd % 4 for hd in head_dims):
            raise ValueError(f'{self.name} needs head widths that are multiples of 4, got {head_dims}')
        if self.learnable:
            self.freqs = nn.ParameterList(
                nn.Parameter(mixed_frequencies(head_dims[s], geometry.heads[s], temperature,
                                               torch.rand(geometry.heads[s]) * 2 * math.pi))
                for s, depth in enumerate(geometry.depths) for _ in range(depth))
        else:
            for s, hd in enumerate(head_dims):
                self.register_buffer(f'axial{s}', mixed_frequencies(hd, 1, temperature), persistent=False)

    def init_non_persistent_buffers(self) -> None:
        """Recompute the fixed frequencies of ``rope_axial`` in place (they are in no checkpoint): for loaders
        that build a model on the meta device and then fill only what a state dict holds (transformers, timm)."""
        for s, (dim, heads) in enumerate(zip(self.geometry.dims, self.geometry.heads)):
            buffer = getattr(self, f'axial{s}', None) if not self.learnable else None
            if buffer is not None:
                with torch.no_grad():
                    buffer.copy_(mixed_frequencies(dim // heads, 1, self.temperature))

    def frequencies(self, stage: int, block: int) -> torch.Tensor:
        if self.learnable:
            return self.freqs[self.geometry.block_index(stage, block)]
        return getattr(self, f'axial{stage}')

    def attention(self, stage: int, hw: HW) -> list[AttentionPosition | None] | None:
        g = self.geometry
        sr = g.sr_ratios[stage]
        out, shared = [], None
        for j in range(g.depths[stage]):
            if shared is not None:
                out.append(shared)
                continue
            freqs = self.frequencies(stage, j)
            query = rotary_angles(freqs, hw)
            key = query if sr == 1 else rotary_angles(freqs, g.key_hw(stage, hw), sr)
            out.append(AttentionPosition(rotary=Rotary(query, key)))
            if not self.learnable:
                shared = out[-1]
        return out

    def parts_of(self, stage: int, blocks: Sequence[int], embedding: bool = False) -> list[nn.Parameter]:
        if not self.learnable:
            return []
        return [self.freqs[self.geometry.block_index(stage, j)] for j in blocks]

    def cut(self, kept_depths: Sequence[int]) -> list[str]:
        if not self.learnable:
            for s in range(len(self.geometry.depths)):
                if s >= len(kept_depths) or not kept_depths[s]:
                    delattr(self, f'axial{s}')
            return []
        g = self.geometry
        kept = [g.block_index(s, j) for s, d in enumerate(kept_depths) for j in range(d)]
        if kept != list(range(len(kept))):
            raise AssertionError('kept blocks must be a prefix of the network order')
        dropped = [f'freqs.{k}' for k in range(len(kept), len(self.freqs))]
        self.freqs = self.freqs[:len(kept)]
        return dropped

    def extra_repr(self) -> str:
        return f'{self.name} (temperature {self.temperature:g})'


class AxialRoPEEncoding(RoPEEncoding):
    __doc__ = RoPEEncoding.__doc__
    name = 'rope_axial'
    learnable = False
    default_temperature = 100.


__all__ = ['AxialRoPEEncoding', 'RoPEEncoding', 'mixed_frequencies', 'rotary_angles']
