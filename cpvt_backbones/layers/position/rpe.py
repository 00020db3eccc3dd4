"""A learned relative position bias on the attention logits (Shaw et al.'s RPE in 2-D, as the paper's)."""
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .base import HW, AttentionPosition, Geometry, PositionEncoding, check_int


def relative_index(hw: HW, key_hw: HW, sr: int, max_distance: int, device=None) -> torch.Tensor:
    """(queries, keys) indices into a (2K + 1)^2 table of 2-D offsets (row-major over (dy, dx)), each axis's
    offset clipped to [-K, K]. Offsets are counted in key-grid units: a query at row r of a map reduced ``sr``
    times for its keys sits at key row r // sr."""
    k = max_distance
    qy = torch.arange(hw[0], device=device) // sr
    qx = torch.arange(hw[1], device=device) // sr
    ky = torch.arange(key_hw[0], device=device)
    kx = torch.arange(key_hw[1], device=device)
    dy = (qy[:, None] - ky[None, :]).clamp(-k, k) + k            # (h, kh)
    dx = (qx[:, None] - kx[None, :]).clamp(-k, k) + k            # (w, kw)
    index = dy[:, None, :, None] * (2 * k + 1) + dx[None, :, None, :]   # (h, w, kh, kw)
    return index.reshape(hw[0] * hw[1], key_hw[0] * key_hw[1])


class RPEEncoding(PositionEncoding):
    """``rpe``: every block's attention adds a learned bias per head to each query-key logit, looked up by
    their 2-D offset, each axis clipped at ``max_distance`` tokens (K, default 8). Queries against a reduced key
    map count offsets in key-grid units. A class token gets no bias.
    Keys ``rel_pos.{k}`` (heads, (2K + 1)^2) for block k in network order; initialised N(0, 0.02) truncated."""
    attr = 'rel_pos'
    name = 'rpe'
    biases_logits = True

    def __init__(self, geometry: Geometry, max_distance: int = 8):
        super().__init__(geometry)
        self.max_distance = check_int(max_distance, 'rpe max_distance')
        size = (2 * max_distance + 1) ** 2
        self.num_tables = sum(geometry.depths)
        for stage, depth in enumerate(geometry.depths):
            for j in range(depth):
                table = nn.Parameter(torch.zeros(geometry.heads[stage], size))
                nn.init.trunc_normal_(table, std=.02)
                self.register_parameter(str(geometry.block_index(stage, j)), table)

    def attention(self, stage: int, hw: HW) -> list[AttentionPosition | None] | None:
        g = self.geometry
        first = g.block_index(stage, 0)
        tables = [getattr(self, str(first + j)) for j in range(g.depths[stage])]
        index = relative_index(hw, g.key_hw(stage, hw), g.sr_ratios[stage], self.max_distance, tables[0].device)
        prefix = g.num_prefix_tokens
        out = []
        for table in tables:
            bias = table[:, index]
            out.append(AttentionPosition(bias=F.pad(bias, (prefix, 0, prefix, 0)) if prefix else bias))
        return out

    def parts_of(self, stage: int, blocks: Sequence[int], embedding: bool = False) -> list[nn.Parameter]:
        return [getattr(self, str(self.geometry.block_index(stage, j))) for j in blocks]

    def cut(self, kept_depths: Sequence[int]) -> list[str]:
        g = self.geometry
        kept = {g.block_index(s, j) for s, d in enumerate(kept_depths) for j in range(d)}
        dropped = [k for k in range(self.num_tables) if k not in kept]
        for k in dropped:
            delattr(self, str(k))
        return [str(k) for k in dropped]

    def extra_repr(self) -> str:
        return f'rpe (K={self.max_distance})'


__all__ = ['RPEEncoding', 'relative_index']
