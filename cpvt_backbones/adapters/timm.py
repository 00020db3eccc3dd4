"""Registers every model of ``cpvt_backbones.list_models()`` in timm's registry, under the same names.

``timm.create_model('pcpvt_small')`` then builds our model through timm's own builder, so timm's conventions
hold: ``features_only=True`` (``out_indices``, ``feature_info``, through the model's ``forward_intermediates``),
``num_classes``, ``in_chans``, any constructor argument (``pos_encoding=...``). ``pretrained=True`` loads the
published weights of the PCPVT models through this package's table and cache (``cpvt_backbones.convert.hub``;
for the others it says none are published), or ``pretrained_cfg_overlay=dict(file=...)`` in any weight layout
``cpvt_backbones.convert`` reads. ``pretrained_cfg`` states no fixed input size.
"""
from functools import partial
from typing import Dict, Mapping

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, register_model

from ..convert import built_weights, fetch_weights, unwrap_state_dict
from ..models.cpvt import CPVT
from ..models.factory import MODEL_SPECS, create_model

# timm's defaults for taking features: the four stages of a pyramid model, the last three blocks of a ViT.
_DEFAULT_OUT_INDICES = {CPVT: 3}


def _pretrained_cfg(name: str) -> Dict:
    first_conv = 'patch_embed.proj' if MODEL_SPECS[name].cls is CPVT else 'patch_embeds.0.proj'
    return dict(url='', num_classes=1000, input_size=(3, 224, 224), fixed_input_size=False, pool_size=None,
                crop_pct=0.9, interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
                first_conv=first_conv, classifier='head', license='apache-2.0')


default_cfgs = {name: _pretrained_cfg(name) for name in MODEL_SPECS}


def _filter_weights(state_dict: Mapping[str, torch.Tensor], model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Any layout we read -> ours, without what the model does not build (as ``convert.load_into``)."""
    return built_weights(model, unwrap_state_dict(state_dict))


def _entrypoint(name: str):
    def build(pretrained: bool = False, **kwargs):
        overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {})
        if pretrained and not overlay.get('file'):  # this package's table and cache (convert.hub), checked
            overlay['file'] = str(fetch_weights(name, classifier=True)[0])
        return build_model_with_cfg(
            partial(create_model, name), name, pretrained, pretrained_filter_fn=_filter_weights,
            feature_cfg=dict(feature_cls='getter', out_indices=_DEFAULT_OUT_INDICES.get(MODEL_SPECS[name].cls, 4)),
            pretrained_cfg_overlay=overlay or None, **kwargs)
    build.__name__ = build.__qualname__ = name
    build.__module__ = __name__
    build.__doc__ = f'{name}: {MODEL_SPECS[name].note} (cpvt_backbones).'
    return build


for _name in MODEL_SPECS:
    globals()[_name] = register_model(_entrypoint(_name))
