"""The position-encoding interface both model families use.

A position encoding may act at three places of a network, and each encoding overrides only the ones it uses:

* ``embed(stage, x, hw, region)``: on a stage's tokens right after its patch embedding (and class token), as
  a table is added;
* ``attention(stage, hw)``: inside attention, one ``AttentionPosition`` per block of the stage;
* ``after_block(stage, block, x, hw, region)``: on the tokens after a block, as a PEG.

An encoding is an ``nn.Module`` mounted on the model under its ``attr`` name (the prefix of its state-dict
keys: ``pos_block`` for the PEG, ``pos_embed``, ``rope``, ``rel_pos``, ``pos_qk``). It is built from the model's
``Geometry`` and its own keyword options, owns its initialisation, and says which of its parts belong to which
blocks (``parts_of``, for freezing) and drops the parts of blocks a model does not build (``cut``).

``region`` (``layers.valid``): ``embed`` and ``after_block`` must give each image's valid tokens what they are
for the image alone; what they leave beyond each image is the next layer's to zero. ``attention`` takes no
region: what it returns may depend on token positions (from the top-left) only.

``biases_logits``: its ``AttentionPosition`` carries a logit ``bias``, which a model takes only with global
attention over keys reduced by 'pad' (a ValueError otherwise).
"""
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ...compat import is_fx_tracing

HW = tuple[int, int]


@dataclass(frozen=True)
class Geometry:
    """What an encoding needs to know of the network: per stage the token width, the number of blocks and
    heads, the stride of its token grid in input pixels, the key/value reduction ratio and how it reduces
    (``layers.Attention``'s ``reduction``; empty: 'pad' everywhere); and the number of leading tokens (a class
    token) that carry no position."""
    dims: tuple[int, ...]
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    strides: tuple[int, ...]
    sr_ratios: tuple[int, ...]
    num_prefix_tokens: int = 0
    reductions: tuple[str, ...] = ()

    @property
    def num_stages(self) -> int:
        return len(self.depths)

    def block_index(self, stage: int, block: int) -> int:
        """The block's index in network order (over all stages)."""
        return sum(self.depths[:stage]) + block

    def key_hw(self, stage: int, hw: HW) -> HW:
        """Size of the key/value map of a stage's attention for an ``hw`` query map (``layers.Attention``:
        'pad' pads to a multiple of the reduction ratio, then reduces; 'drop' drops the remainder)."""
        sr = self.sr_ratios[stage]
        if self.reductions and self.reductions[stage] == 'drop':
            return max(hw[0] // sr, 1), max(hw[1] // sr, 1)
        return (hw[0] + sr - 1) // sr, (hw[1] + sr - 1) // sr

    def check_key_grid(self, encoding: str) -> None:
        """A ValueError naming ``encoding`` (which places keys on the reduced token grid) where a stage's keys
        are pooled (``reduction='pool'``) and so lie on no grid."""
        if 'pool' in self.reductions:
            raise ValueError(f'position encoding {encoding!r} places keys on the reduced token grid; pooled keys '
                             "(reduction='pool', PVTv2-li) lie on none")


class Rotary(NamedTuple):
    """Rotation angles (heads or 1, tokens, head_dim // 2) for the non-prefix queries and keys; channel pairs
    (2i, 2i + 1) of a head rotate by angle i (timm's interleaved layout)."""
    query: torch.Tensor
    key: torch.Tensor


class AttentionPosition(NamedTuple):
    """What an encoding contributes to one block's attention; any field may be None.

    * ``qk_input``: a module called as ``qk_input(x, hw, region)`` on the normed tokens; its output replaces them as
      the input of the query and key projections (values still see the tokens);
    * ``rotary``: angles that rotate queries and keys after the projections (``rotate``);
    * ``bias``: an additive (heads, queries, keys) bias on the attention logits.
    """
    qk_input: nn.Module | None = None
    rotary: Rotary | None = None
    bias: torch.Tensor | None = None


def merge_attention(parts: Sequence[AttentionPosition | None], names: Sequence[str]
                    ) -> AttentionPosition | None:
    """One ``AttentionPosition`` from several encodings' (each field from at most one of them)."""
    fields = {}
    for part, name in zip(parts, names):
        for field, value in zip(AttentionPosition._fields, part or AttentionPosition()):
            if value is None:
                continue
            if field in fields:
                raise ValueError(f'two position encodings ({fields[field][0]} and {name}) both set the attention '
                                 f'{field}; combine at most one of each kind')
            fields[field] = (name, value)
    return AttentionPosition(**{f: v for f, (_, v) in fields.items()}) if fields else None


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on (B, heads, N, head_dim): channel pair (2i, 2i + 1) of each of the last
    ``angles.shape[-2]`` tokens turns by ``angles[..., i]``; leading (class) tokens pass unchanged. Computed in
    float32, returned in ``x``'s dtype."""
    prefix = x.shape[-2] - angles.shape[-2]
    tokens = x[..., prefix:, :].float().unflatten(-1, (-1, 2))
    a, b = tokens.unbind(-1)
    cos, sin = angles.cos(), angles.sin()
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)
    # under torch.fx the prefix length is symbolic: concatenate the (possibly empty) prefix always
    return torch.cat((x[..., :prefix, :], out), dim=-2) if is_fx_tracing() or prefix else out


def grid_coordinates(hw: HW, step: float = 1., device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column coordinates (flattened, row-major) of an ``hw`` token grid whose tokens are ``step``
    units apart, each at the centre of its cell: 0, 1, 2 ... for step 1; (step - 1) / 2 + step * i for the
    tokens of a map reduced ``step`` times (their centres in the unreduced grid's units)."""
    offset = (step - 1) / 2
    rows = torch.arange(hw[0], device=device, dtype=torch.float32) * step + offset
    cols = torch.arange(hw[1], device=device, dtype=torch.float32) * step + offset
    y, x = torch.meshgrid(rows, cols, indexing='ij')
    return y.reshape(-1), x.reshape(-1)


def check_positions(positions, depths: Sequence[int], name: str, default: Callable[[int], Sequence[int]],
                    first: int = 0) -> tuple[tuple[int, ...], ...]:
    """Per-stage block indices, sorted: ``None`` takes ``default(depth)`` for every stage; a flat sequence of
    ints is accepted for a one-stage model; each stage's indices distinct and within ``first``..depth - 1. A
    TypeError or ValueError naming ``name`` otherwise."""
    if positions is None:
        return tuple(tuple(default(d)) for d in depths)
    positions = tuple(positions)
    if all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
        if len(depths) != 1:
            raise TypeError(f'{name} of a {len(depths)}-stage model is one sequence of block indices per stage, '
                            f'e.g. {tuple((0,) for _ in depths)}; got {positions!r}')
        positions = (positions,)
    if len(positions) != len(depths):
        raise ValueError(f'{name} needs one entry per stage ({len(depths)}), got {positions!r}')
    out = []
    for stage, (blocks, depth) in enumerate(zip(positions, depths)):
        blocks = tuple(blocks)
        where = f'{name}[{stage}]' if len(depths) > 1 else name
        if any(not isinstance(b, int) or isinstance(b, bool) for b in blocks):
            raise TypeError(f'{where} must hold block indices (ints), got {blocks!r}')
        if any(not first <= b < depth for b in blocks) or len(set(blocks)) != len(blocks):
            raise ValueError(f'{where} must be distinct block indices within {first}..{depth - 1}, got {blocks!r}')
        out.append(tuple(sorted(blocks)))
    return tuple(out)


def check_int(value, name: str, low: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``low``, else a ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f'{name} must be an int >= {low}, got {value!r}')
    return value


def check_odd_kernel(value, name: str, low: int = 1) -> int:
    """``value`` if it is an odd int >= ``low``, else a ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or value % 2 == 0:
        raise ValueError(f'{name} must be odd and >= {low} (an int: zero padding k // 2 keeps the map size), '
                         f'got {value!r}')
    return value


Part = nn.Module | nn.Parameter


class PositionEncoding(nn.Module):
    """Base class: no effect at any of the three places (module docstring). Subclasses set ``attr``, ``name``
    (their key in ``layers.position.ENCODINGS``) and ``biases_logits``, and override what they use."""
    attr: str = ''
    name: str = ''
    biases_logits: bool = False

    def __init__(self, geometry: Geometry):
        super().__init__()
        self.geometry = geometry

    def embed(self, stage: int, x: torch.Tensor, hw: HW, region) -> torch.Tensor:
        return x

    def attention(self, stage: int, hw: HW) -> list[AttentionPosition | None] | None:
        """One entry per block of ``stage`` (or None: nothing for any block)."""
        return None

    def after_block(self, stage: int, block: int, x: torch.Tensor, hw: HW, region) -> torch.Tensor:
        return x

    def parts_of(self, stage: int, blocks: Sequence[int], embedding: bool = False) -> list[Part]:
        """The modules/parameters that belong to these blocks of ``stage`` (and, with ``embedding``, to the
        stage's patch embedding): what freezing them also freezes. A part shared with blocks not listed is
        not returned."""
        return []

    def cut(self, kept_depths: Sequence[int]) -> list[str]:
        """Keep the parts of the first ``kept_depths[i]`` blocks of every stage i (0: the stage is dropped),
        drop the rest; return the dropped key prefixes relative to ``attr`` (e.g. ``'3.'``)."""
        return []


class Placed:
    """Mixin for an encoding whose modules sit at (stage, block) places: they are its children ``'0'``,
    ``'1'``, ... in network order (so their keys read ``{attr}.{k}.*``), ``self[k]`` is the k-th."""
    places: list[tuple[int, int]]

    def _place(self, places: Sequence[tuple[int, int]], modules: Sequence[nn.Module]) -> None:
        self.places = list(places)
        for k, module in enumerate(modules):
            self.add_module(str(k), module)

    def __getitem__(self, k: int) -> nn.Module:
        return self._modules[str(range(len(self.places))[k])]

    def __len__(self) -> int:
        return len(self.places)

    def at(self, stage: int, block: int) -> nn.Module | None:
        """The module at that place, or None."""
        for k, (s, b) in enumerate(self.places):
            if s == stage and b == block:
                return self._modules[str(k)]
        return None

    def placed_parts(self, stage: int, blocks: Sequence[int]) -> list[nn.Module]:
        return [self[k] for k, (s, b) in enumerate(self.places) if s == stage and b in blocks]

    def keep_placed(self, kept_depths: Sequence[int]) -> list[str]:
        """Keep the modules of kept blocks (a prefix, as they are in network order); return the dropped
        ones' key prefixes."""
        kept = [k for k, (s, b) in enumerate(self.places) if s < len(kept_depths) and b < kept_depths[s]]
        if kept != list(range(len(kept))):
            raise AssertionError('kept places must be a prefix of the network order')
        dropped = [f'{k}.' for k in range(len(kept), len(self.places))]
        for k in range(len(kept), len(self.places)):
            del self._modules[str(k)]
        self.places = self.places[:len(kept)]
        return dropped


def sincos_angles(values: torch.Tensor, num: int, temperature: float) -> torch.Tensor:
    """(N, num) angles ``value / temperature ** (i / num)``, i = 0..num - 1, of the (N,) ``values``."""
    freqs = temperature ** (-torch.arange(num, dtype=torch.float32, device=values.device) / num)
    return values[:, None] * freqs[None]


def uniform_magnitudes(head_dim: int, temperature: float) -> torch.Tensor:
    """RoPE's (head_dim // 4) frequency magnitudes 1 / temperature ** (4i / head_dim) (Heo et al.)."""
    return 1. / temperature ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)


__all__ = ['AttentionPosition', 'Geometry', 'HW', 'Placed', 'PositionEncoding', 'Rotary', 'check_int',
           'check_odd_kernel', 'check_positions', 'grid_coordinates', 'merge_attention', 'rotate', 'sincos_angles',
           'uniform_magnitudes']
