"""Named size variants (data, not classes), ``create_model`` and ``list_models``."""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..convert import fetch_weights, load_pretrained, resolve_checkpoint
from .base import CPVTBase
from .cpvt import CPVT
from .pcpvt import PyramidCPVT
from .pvt_v2 import SIZES as PVT_V2_SIZES
from .pvt_v2 import PVTv2
from .svt import TwinsSVT


@dataclass(frozen=True)
class ModelSpec:
    """A named variant: its family ``cls``, the constructor ``settings``, a ``note`` for listings, ``paper``
    (a model of a paper, with published parameter counts) and ``default`` (its family's default variant, the
    ``arch`` its OpenMMLab backbone starts from: one per family)."""
    cls: type[nn.Module]
    settings: Mapping[str, Any]
    note: str = ''
    paper: bool = True
    default: bool = False


_PCPVT = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4),
              sr_ratios=(8, 4, 2, 1))
_SVT = dict(mlp_ratios=(4, 4, 4, 4), sr_ratios=(8, 4, 2, 1), window_sizes=(7, 7, 7, 7))
_DEIT = {'tiny': dict(embed_dim=192, num_heads=3), 'small': dict(embed_dim=384, num_heads=6),
         'base': dict(embed_dim=768, num_heads=12)}

MODEL_SPECS: dict[str, ModelSpec] = {
    'pcpvt_tiny': ModelSpec(PyramidCPVT, dict(embed_dims=(32, 64, 160, 256), num_heads=(1, 2, 5, 8),
                                              mlp_ratios=(4, 4, 4, 4), sr_ratios=(8, 4, 2, 1), depths=(2, 2, 2, 2)),
                            'not a paper model: a ~2.6M-parameter pyramid small enough to train on 2 CPU cores',
                            paper=False),
    'pcpvt_small': ModelSpec(PyramidCPVT, dict(_PCPVT, depths=(3, 4, 6, 3)), 'Twins-PCPVT-S, 24.1M', default=True),
    'pcpvt_base': ModelSpec(PyramidCPVT, dict(_PCPVT, depths=(3, 4, 18, 3)), 'Twins-PCPVT-B, 43.8M'),
    'pcpvt_large': ModelSpec(PyramidCPVT, dict(_PCPVT, depths=(3, 8, 27, 3)), 'Twins-PCPVT-L, 61.0M'),
    'svt_small': ModelSpec(TwinsSVT, dict(_SVT, embed_dims=(64, 128, 256, 512), num_heads=(2, 4, 8, 16),
                                          depths=(2, 2, 10, 4)), 'Twins-SVT-S, 24.1M', default=True),
    'svt_base': ModelSpec(TwinsSVT, dict(_SVT, embed_dims=(96, 192, 384, 768), num_heads=(3, 6, 12, 24),
                                         depths=(2, 2, 18, 2)), 'Twins-SVT-B, 56.1M'),
    'svt_large': ModelSpec(TwinsSVT, dict(_SVT, embed_dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32),
                                          depths=(2, 2, 18, 2)), 'Twins-SVT-L, 99.3M'),
}
for _size, _dims in _DEIT.items():
    MODEL_SPECS[f'cpvt_{_size}'] = ModelSpec(
        CPVT, dict(_dims, class_token=True), f'CPVT-{_size[0].upper()}: class token, PEG after blocks 0-5')
    MODEL_SPECS[f'cpvt_{_size}_gap'] = ModelSpec(
        CPVT, dict(_dims, class_token=False), f'CPVT-{_size[0].upper()}-GAP: no class token, global average pool',
        default=_size == 'small')


for _name, _settings in PVT_V2_SIZES.items():
    MODEL_SPECS[_name] = ModelSpec(PVTv2, _settings, f'PVTv2-{_name[7:].upper().replace("_LI", "-li")} (timm {_name})',
                                   default=_name == 'pvt_v2_b2')


def list_models() -> list[str]:
    return sorted(MODEL_SPECS)


def model_settings(arch: str | Mapping[str, Any], family: type[nn.Module]) -> dict[str, Any]:
    """Constructor settings for ``arch``: a registered name, or a dict of ``family``'s constructor arguments
    (optionally ``base='<name>'`` to start from a named variant)."""
    if isinstance(arch, str):
        spec = _spec(arch)
        if spec.cls is not family:
            same = [n for n in list_models() if MODEL_SPECS[n].cls is family]
            raise ValueError(f'{arch!r} is a {spec.cls.__name__} model, not a {family.__name__} one; '
                             f'valid names: {same}')
        return dict(spec.settings)
    if not isinstance(arch, Mapping):
        raise TypeError(f'arch must be a model name or a dict of settings, got {type(arch).__name__}')
    settings = dict(arch)
    base = settings.pop('base', None)
    if base is not None:
        settings = {**model_settings(base, family), **settings}
    _check_kwargs(family, settings)
    return settings


def _spec(name: str) -> ModelSpec:
    if name not in MODEL_SPECS:
        raise ValueError(f'unknown model {name!r}; valid names: {list_models()}')
    return MODEL_SPECS[name]


def _check_kwargs(cls: type[CPVTBase], kwargs: Mapping[str, Any]) -> None:
    valid = cls.argument_names()
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise TypeError(f'{cls.__name__} has no argument(s) {unknown}; valid arguments: {valid}')


def create_model(name: str, pretrained: None | bool | str = None, *, allow_nonfinite: bool = False,
                 **overrides: Any) -> nn.Module:
    """Build a named model. ``overrides`` are constructor arguments (``pos_encoding``, ``drop_path_rate``,
    ``features_only``, ``out_indices``, ``frozen_stages``, ...); ``pos_encoding`` takes a name (``'rope_mixed'``,
    ``'learned+peg'``), a dict (``dict(type='peg', positions=(0,), kernel_size=5)``) or a list of those
    (``cpvt_backbones.layers.position``).
    ``features_only=True`` implies ``num_classes=0``.

    ``pretrained=True`` loads the model's published ImageNet weights (``convert.hub``: fetched once into the
    cache, checked); a string is a weight file, a URL or a model name. Weights in any layout that
    ``cpvt_backbones.convert`` reads are loaded strictly into what the model builds; with published weights a
    classifier head of another size than ImageNet's 1000 classes is left freshly initialised.
    Weights with NaN or Inf values are refused by key unless ``allow_nonfinite`` (``convert.load_into``)."""
    spec = _spec(name)
    _check_kwargs(spec.cls, overrides)
    kwargs = {**spec.settings, **overrides}
    if kwargs.get('features_only') and 'num_classes' not in overrides:
        kwargs['num_classes'] = 0
    model = spec.cls(**kwargs)
    if pretrained is True:
        fresh_head = bool(model.num_classes) and model.num_classes != 1000
        path, _ = fetch_weights(name, classifier=bool(model.num_classes) and not fresh_head)
        load_pretrained(model, path, skip=('head.',) if fresh_head else (), allow_nonfinite=allow_nonfinite)
    elif pretrained:
        load_pretrained(model, resolve_checkpoint(str(pretrained)), allow_nonfinite=allow_nonfinite)
    return model
