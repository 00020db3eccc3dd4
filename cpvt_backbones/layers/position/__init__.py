"""Position encodings as one pluggable part (``base.PositionEncoding``), one file each, registered here.

``build_position_encodings(spec, geometry)`` turns what a user writes into encodings:

* a name: ``'peg'``, ``'rope_mixed'``, ``'none'`` ...; names joined by ``+`` combine (``'learned+peg'``);
* a dict with ``type`` and the encoding's options: ``dict(type='peg', positions=(0,), kernel_size=3)``;
* a list of names or dicts (a combination); ``None``, ``'none'`` or ``()``: no position encoding.

A new encoding is a ``PositionEncoding`` subclass in its own file plus its line in ``ENCODINGS``; code outside
the package adds one with ``register_encoding`` (or ``registered_encoding`` for a ``with`` block). Its keys sit
under ``attr + '.'`` in a model's state dict; ``state_dict_roots()`` lists these roots for every registered
encoding, so the checkpoint converters (``cpvt_backbones.convert``) recognise a new encoding's keys as native.
"""
import inspect
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .base import AttentionPosition, Geometry, PositionEncoding, Rotary, merge_attention, rotate
from .conv1x1 import Conv1x1Encoding
from .learned import LearnedEncoding, resize_table
from .peg import PEG, PEG_TYPES, PEGEncoding, peg_responses
from .peg_qk import PEGQKEncoding
from .rope import AxialRoPEEncoding, RoPEEncoding
from .rpe import RPEEncoding
from .sincos import SinCosEncoding, sincos_table

ENCODINGS: dict[str, type[PositionEncoding]] = {
    cls.name: cls for cls in (PEGEncoding, Conv1x1Encoding, PEGQKEncoding, LearnedEncoding, SinCosEncoding,
                              RPEEncoding, AxialRoPEEncoding, RoPEEncoding)}

Spec = None | str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]]


def register_encoding(cls: type[PositionEncoding]) -> type[PositionEncoding]:
    """Add ``cls`` to ``ENCODINGS`` under its ``name`` (a name already taken, or ``'none'``, raises); returns it."""
    if not (isinstance(cls, type) and issubclass(cls, PositionEncoding)):
        raise TypeError(f'a position encoding is a PositionEncoding subclass, got {cls!r}')
    if not cls.name or not cls.attr:
        raise ValueError(f'{cls.__name__} must set name (its registry name) and attr (where models mount it)')
    if cls.name in ENCODINGS or cls.name == 'none':
        raise ValueError(f'position encoding name {cls.name!r} is taken')
    ENCODINGS[cls.name] = cls
    return cls


def unregister_encoding(name: str) -> type[PositionEncoding]:
    """Remove the encoding registered under ``name`` from ``ENCODINGS``; returns its class."""
    if name not in ENCODINGS:
        raise KeyError(f'no position encoding {name!r} is registered')
    return ENCODINGS.pop(name)


@contextmanager
def registered_encoding(cls: type[PositionEncoding]) -> Iterator[type[PositionEncoding]]:
    """``cls`` registered inside the ``with`` block only: the registry is as before once it exits."""
    register_encoding(cls)
    try:
        yield cls
    finally:
        unregister_encoding(cls.name)


def state_dict_roots() -> tuple[str, ...]:
    """The state-dict key prefixes of the registered encodings: ``attr + '.'`` for each attribute an encoding is
    mounted under (encodings that share one, as ``peg`` and ``conv1x1``, give it once), in registry order."""
    return tuple(dict.fromkeys(f'{cls.attr}.' for cls in ENCODINGS.values()))


def parse_position_encoding(spec: Spec) -> list[dict[str, Any]]:
    """The spec as a list of ``dict(type=..., **options)`` (see the module docstring)."""
    if spec is None:
        return []
    if isinstance(spec, str):
        names = [n.strip() for n in spec.split('+')]
        return [] if names == ['none'] else [dict(type=n) for n in names]
    if isinstance(spec, Mapping):
        return [dict(spec)]
    if isinstance(spec, Sequence):
        out = []
        for item in spec:
            if not isinstance(item, (str, Mapping)):
                raise TypeError(f'pos_encoding list items must be names or dicts with a type, got {item!r}')
            out += parse_position_encoding(item)
        return out
    raise TypeError(f'pos_encoding must be a name, a dict with a type, or a list of those; got {spec!r}')


def build_position_encodings(spec: Spec, geometry: Geometry) -> list[PositionEncoding]:
    """The encodings ``spec`` names, built for ``geometry``; errors name the encoding and its valid options."""
    out: list[PositionEncoding] = []
    for item in parse_position_encoding(spec):
        options = dict(item)
        name = options.pop('type', None)
        if name == 'none':
            if options:
                raise ValueError(f"position encoding 'none' takes no options, got {sorted(options)}")
            continue
        if name not in ENCODINGS:
            raise ValueError(f'unknown position encoding {name!r}; valid names: {sorted(ENCODINGS) + ["none"]}')
        cls = ENCODINGS[name]
        valid = [p for p in inspect.signature(cls.__init__).parameters if p not in ('self', 'geometry')]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise TypeError(f'position encoding {name!r} has no option(s) {unknown}; valid options: {valid}')
        encoding = cls(geometry, **options)
        clash = [e for e in out if e.attr == encoding.attr]
        if clash:
            raise ValueError(f'position encodings {clash[0].name!r} and {name!r} cannot be combined: both are '
                             f'{encoding.attr}.* (one of each kind)')
        out.append(encoding)
    return out


__all__ = ['AttentionPosition', 'ENCODINGS', 'Geometry', 'PEG', 'PEG_TYPES', 'PositionEncoding', 'Rotary',
           'build_position_encodings', 'merge_attention', 'parse_position_encoding', 'peg_responses',
           'register_encoding', 'registered_encoding', 'resize_table', 'rotate', 'sincos_table', 'state_dict_roots',
           'unregister_encoding']
