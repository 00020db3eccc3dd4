"""Registers every model of ``cpvt_backbones.list_models()`` in timm's registry, under the same names, except
where timm names a model of its own so (PVTv2's ``pvt_v2_*``): ours is then ``cpvt_backbones_<name>``
(``TIMM_NAMES``), and timm's stays timm's.

``timm.create_model('pcpvt_small')`` then builds our model through timm's own builder, so timm's conventions
hold: ``num_classes``, ``in_chans``, any constructor argument (``pos_encoding=...``), ``forward_intermediates``.

* Pretrained configs follow timm's tags: the PCPVT and SVT models with published weights have ``<name>.in1k``
  (the default tag), naming the files the weights come from (``hf_hub_id`` / ``hf_hub_filename``: timm's hub copy
  ``timm/twins_pcpvt_{size}.in1k`` or ``timm/twins_svt_{size}.in1k``; ``url``: timm's release file), so
  ``timm.list_models(pretrained=True)`` lists them and ``timm.is_model_pretrained('pcpvt_small')`` is True.
  ``pretrained=True`` loads them through this package's table and checked cache
  (``cpvt_backbones.convert.hub.fetch_weights``; offline, its error names every file and URL tried), not through
  timm's downloader; the other models say that none are published.
  ``pretrained_cfg_overlay=dict(file=...)`` loads a file in any weight layout ``cpvt_backbones.convert`` reads.
  ``pretrained_cfg`` states no fixed input size.
* ``features_only=True`` builds this package's dense backbone (``features_only=True`` of the core model): the
  four stages of a pyramid model, the simple feature pyramid of a columnar one (strides 4, 8, 16, 32, with
  dim/4, dim/2, dim, dim channels; its layers are new, no published weights hold them). ``out_indices`` takes
  timm's forms (default all four; an int n is the last n, negative indices count from the end). It returns a
  list of NCHW maps of size ceil(H / s) x ceil(W / s) and has timm's ``feature_info`` (``channels()``,
  ``reduction()``). ``feature_cls='fx'`` holds the same backbone as a ``torch.fx.GraphModule`` (identical
  outputs); the default (``None``, ``'getter'`` or ``'list'``) holds the module itself. timm's hook-based
  extractors (``'hook'``, ``'dict'``) are refused: the maps are not outputs of a submodule.
"""
import re
from collections.abc import Mapping
from functools import partial

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import FeatureInfo, build_model_with_cfg, generate_default_cfgs, is_model, register_model
from timm.models._builder import pretrained_cfg_for_features
from torch import nn

from ..convert import built_weights, fetch_weights, unwrap_state_dict
from ..convert.hub import PRETRAINED
from ..models.base import take_indices
from ..models.cpvt import CPVT, PYRAMID_STRIDES
from ..models.factory import MODEL_SPECS, create_model

# Our name -> its name in timm's registry (decided once, before ours are registered).
TIMM_NAMES = {name: f'cpvt_backbones_{name}' if is_model(name) else name for name in MODEL_SPECS}
_HUB_FILE = re.compile(r'https://huggingface\.co/([^/]+/[^/]+)/resolve/main/(.+)$')
_FEATURE_CLASSES = (None, 'getter', 'list', 'fx')


def _pretrained_cfg(name: str, **weights: str) -> dict:
    first_conv = 'patch_embed.proj' if MODEL_SPECS[name].cls is CPVT else 'patch_embeds.0.proj'
    return dict(num_classes=1000, input_size=(3, 224, 224), fixed_input_size=False, pool_size=None,
                crop_pct=0.9, interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
                first_conv=first_conv, classifier='head', license='apache-2.0', **weights)


def _weights(name: str) -> dict[str, str]:
    """Where ``name``'s published classifier weights are, in timm's terms (from ``convert.hub.PRETRAINED``)."""
    out: dict[str, str] = {}
    for source in (s for s in PRETRAINED[name] if s.classifier):
        hub = _HUB_FILE.match(source.url)
        if hub and 'hf_hub_id' not in out:
            out.update(hf_hub_id=hub.group(1), hf_hub_filename=hub.group(2))
        elif not hub and 'url' not in out:
            out['url'] = source.url
    return out


default_cfgs = generate_default_cfgs({
    (f'{TIMM_NAMES[name]}.in1k' if name in PRETRAINED else TIMM_NAMES[name]):
        _pretrained_cfg(name, **(_weights(name) if name in PRETRAINED else {}))
    for name in MODEL_SPECS})


class Features(nn.Module):
    """timm's ``features_only`` contract over one of this package's dense backbones (``model``, the module or
    its ``torch.fx`` trace): ``forward(x)`` is the list of its maps, ``feature_info`` a ``timm.models.FeatureInfo``
    of their modules, channels and reductions."""

    def __init__(self, model: nn.Module, feature_info: FeatureInfo):
        super().__init__()
        self.model = model
        self.feature_info = feature_info

    def forward(self, x: torch.Tensor):
        return list(self.model(x))


def _filter_weights(state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Any layout we read -> ours, without what the model does not build (as ``convert.load_into``)."""
    return built_weights(model, unwrap_state_dict(state_dict))


def _features(name: str, pretrained: bool, out_indices, feature_cls: str | None, kwargs) -> nn.Module:
    if feature_cls not in _FEATURE_CLASSES:
        raise ValueError(f'{name}: feature_cls must be one of {_FEATURE_CLASSES}, got {feature_cls!r} (the maps of '
                         "this package's dense backbones are not outputs of one submodule, as timm's hook-based "
                         'extractors need)')
    kwargs.pop('feature_cfg', None)
    kwargs['num_classes'] = 0
    levels = len(PYRAMID_STRIDES) if MODEL_SPECS[name].cls is CPVT else \
        len(kwargs.get('depths') or MODEL_SPECS[name].settings['depths'])
    out_indices = tuple(take_indices(levels, out_indices)[0])
    model = build_model_with_cfg(partial(create_model, name, features_only=True, out_indices=out_indices),
                                 TIMM_NAMES[name], pretrained, pretrained_filter_fn=_filter_weights, **kwargs)
    prefix = 'simple_fpn' if isinstance(model, CPVT) else 'blocks'
    info = FeatureInfo([dict(module=f'{prefix}.{i}', num_chs=c, reduction=s) for i, c, s in
                        zip(out_indices, model.out_channels, model.strides, strict=True)],
                       tuple(range(len(out_indices))))
    features = Features(torch.fx.symbolic_trace(model) if feature_cls == 'fx' else model, info)
    features.pretrained_cfg = features.default_cfg = pretrained_cfg_for_features(model.pretrained_cfg)
    return features


def _entrypoint(name: str):
    def build(pretrained: bool = False, **kwargs):
        overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {})
        if pretrained and not overlay.get('file'):  # this package's table and cache (convert.hub), checked
            overlay['file'] = str(fetch_weights(name, classifier=True)[0])
        kwargs['pretrained_cfg_overlay'] = overlay or None
        if kwargs.pop('features_only', False):
            return _features(name, pretrained, kwargs.pop('out_indices', None), kwargs.pop('feature_cls', None),
                             kwargs)
        return build_model_with_cfg(partial(create_model, name), TIMM_NAMES[name], pretrained,
                                    pretrained_filter_fn=_filter_weights, **kwargs)
    build.__name__ = build.__qualname__ = TIMM_NAMES[name]
    build.__module__ = __name__
    build.__doc__ = f'{name}: {MODEL_SPECS[name].note} (cpvt_backbones).'
    return build


for _name in MODEL_SPECS:
    globals()[TIMM_NAMES[_name]] = register_model(_entrypoint(_name))
