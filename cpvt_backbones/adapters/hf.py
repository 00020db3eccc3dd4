"""Every model of ``cpvt_backbones.list_models()`` as a native Hugging Face transformers backbone.

``CPVTBackboneConfig(arch='pcpvt_small', out_features=[...])`` and ``CPVTBackbone(config)`` follow transformers'
backbone conventions (``BackboneConfigMixin``, ``BackboneMixin``): ``stage_names`` are ``stem``, ``stage1`` ..
``stage4``; ``out_features`` / ``out_indices`` pick among them (default the last); ``forward`` returns
``BackboneOutput(feature_maps, hidden_states, attentions=None)``. Importing this module registers both classes
with ``AutoConfig`` / ``AutoBackbone`` under the model type ``cpvt_backbones`` and changes nothing else, so
``AutoBackbone.from_config``, ``from_pretrained(folder)`` and transformers' dense models built from
``backbone_config=CPVTBackboneConfig(...)`` (UperNet, Mask2Former, DETR) take it. A saved folder also loads with
``trust_remote_code=True`` without this import (``CPVTBackboneConfig.save_pretrained``).
"""
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from transformers import AutoBackbone, AutoConfig, PreTrainedConfig, PreTrainedModel
from transformers.backbone_utils import BackboneConfigMixin, BackboneMixin
from transformers.modeling_outputs import BackboneOutput

from ..layers import tokens_to_map
from ..models.base import init_weights
from ..models.cpvt import PYRAMID_STRIDES
from ..models.factory import MODEL_SPECS, create_model, list_models
from ..models.pcpvt import Pyramid

LOADER_MODULE = 'cpvt_backbones_hf'
_LOADER_SOURCE = '''"""Lets transformers load this folder with trust_remote_code=True: the classes come from the
installed cpvt_backbones package (this file holds no model code)."""
from cpvt_backbones.adapters.hf import CPVTBackbone, CPVTBackboneConfig

__all__ = ['CPVTBackbone', 'CPVTBackboneConfig']
'''
# The config's own fields, passed to the model's constructor under these names.
_MODEL_FIELDS = {'num_channels': 'in_chans', 'pos_encoding': 'pos_encoding', 'drop_rate': 'drop_rate',
                 'attn_drop_rate': 'attn_drop_rate', 'drop_path_rate': 'drop_path_rate',
                 'frozen_stages': 'frozen_stages'}
# What the backbone sets itself: features_only builds all levels, so every stage is there for any out_features.
_FIXED_ARGUMENTS = ('features_only', 'out_indices', 'num_classes')


def _num_levels(arch: str, model_args: dict[str, Any]) -> int:
    """Feature maps ``create_model(arch, features_only=True, **model_args)`` returns: one per stage of a pyramid
    model, the simple feature pyramid's four for a columnar one."""
    spec = MODEL_SPECS[arch]
    if issubclass(spec.cls, Pyramid):
        return len(model_args.get('depths', spec.settings['depths']))
    return len(PYRAMID_STRIDES)


@strict
class CPVTBackboneConfig(BackboneConfigMixin, PreTrainedConfig):
    """A CPVT / PCPVT backbone: ``create_model(arch, features_only=True, ...)`` with these settings.

    Args:
        arch: a name of ``cpvt_backbones.list_models()``.
        num_channels: input channels (the model's ``in_chans``; ``in_chans`` is accepted as an alias).
        pos_encoding: the model's ``pos_encoding`` (a name, a dict with ``type``, or a list of those); None keeps
            the model's default (``'peg'``).
        drop_rate, attn_drop_rate, drop_path_rate, frozen_stages: the model's arguments of the same names.
        model_args: any other constructor argument of the model, as JSON values (``layer_scale_init``,
            ``grad_checkpointing``, ``norm_eps``, per-stage settings, ...); ``features_only``, ``out_indices`` and
            ``num_classes`` are set by the backbone.
        pretrained: weights loaded when the backbone is built from this config (``CPVTBackbone(config)``,
            ``AutoBackbone.from_config``, inside UperNet/Mask2Former/DETR): True for the published ones, or a
            weight file, URL or model name, exactly as ``create_model(..., pretrained=)`` reads them (strict).
            ``from_pretrained(folder)`` ignores it and loads the folder's weights.
        out_features / out_indices: which of ``stage_names`` (``stem``, ``stage1`` ..) ``feature_maps`` holds,
            aligned and checked as in every transformers backbone; default the last stage.

    ``stem`` is the first patch embedding's output (stride 4 for PCPVT, the stride-16 token map for CPVT);
    ``stage1`` .. are the maps ``create_model(arch, features_only=True)`` returns (strides 4, 8, 16, 32). A
    ValueError for an unknown ``arch``, or a ``model_args`` key that the model does not take or that is a field
    or set by the backbone.
    """

    model_type = 'cpvt_backbones'
    attribute_map = {'in_chans': 'num_channels'}

    arch: str = 'pcpvt_small'
    num_channels: int = 3
    pos_encoding: str | dict | list | None = None
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    frozen_stages: int = -1
    model_args: dict | None = None
    pretrained: bool | str | None = None

    def __post_init__(self, **kwargs):
        if self.arch not in MODEL_SPECS:
            raise ValueError(f'unknown arch {self.arch!r}; valid names: {list_models()}')
        model_args = dict(self.model_args or {})
        valid = MODEL_SPECS[self.arch].cls.argument_names()
        fixed = sorted(set(model_args) & set(_FIXED_ARGUMENTS))
        if fixed:
            raise ValueError(f'model_args must not set {fixed}: the backbone builds every level '
                             '(features_only=True) and selects with out_features / out_indices')
        taken = sorted(set(model_args) & set(_MODEL_FIELDS.values()))
        if taken:
            raise ValueError(f'model_args {taken} are fields of CPVTBackboneConfig: set them there '
                             f'({", ".join(f"{k}=" for k, v in _MODEL_FIELDS.items() if v in taken)})')
        unknown = sorted(set(model_args) - set(valid))
        if unknown:
            raise ValueError(f'{self.arch} takes no argument(s) {unknown}; valid arguments: {valid}')
        self.stage_names = ['stem'] + [f'stage{i}' for i in range(1, _num_levels(self.arch, model_args) + 1)]
        self.set_output_features_output_indices(out_indices=kwargs.pop('out_indices', None),
                                                out_features=kwargs.pop('out_features', None))
        super().__post_init__(**kwargs)

    def model_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``create_model(self.arch, ...)`` this config describes, less ``pretrained``."""
        kwargs = {arg: getattr(self, field) for field, arg in _MODEL_FIELDS.items()}
        if kwargs['pos_encoding'] is None:
            del kwargs['pos_encoding']
        return {**kwargs, **(self.model_args or {}), 'features_only': True}

    def save_pretrained(self, save_directory: str | Path, push_to_hub: bool = False, **kwargs) -> None:
        """transformers' ``save_pretrained``, plus ``cpvt_backbones_hf.py`` in the folder (importing these classes
        from the installed package) and ``auto_map`` naming it: ``trust_remote_code=True`` then loads the folder
        in a process that has not imported this module (the package installed)."""
        self.auto_map = {'AutoConfig': f'{LOADER_MODULE}.CPVTBackboneConfig',
                         'AutoBackbone': f'{LOADER_MODULE}.CPVTBackbone', 'AutoModel': f'{LOADER_MODULE}.CPVTBackbone'}
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        (Path(save_directory) / f'{LOADER_MODULE}.py').write_text(_LOADER_SOURCE)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = 'AutoConfig') -> None:
        """Does nothing: ``save_pretrained`` writes the loader file and ``auto_map``."""
        # transformers' registration (applied after a trust_remote_code load) would copy this module's file into
        # the folder, and this file imports the package relatively.


class CPVTBackbone(BackboneMixin, PreTrainedModel):
    """``create_model(config.arch, features_only=True, **config.model_kwargs())`` as a transformers backbone.

    The network is ``self.model``, built by ``create_model`` with every level, so its state dict is
    ``create_model``'s under the prefix ``model.`` whatever ``out_features`` says, and its stage maps are
    exactly ``create_model``'s outputs. Parameters keep ``create_model``'s initialisation, or the weights of
    ``config.pretrained``. Inputs of any height and width >= 1 give maps of ceil(H / s) x ceil(W / s) at stride s.
    """

    config_class = CPVTBackboneConfig
    main_input_name = 'pixel_values'
    input_modalities = ('image',)
    has_attentions = False
    supports_gradient_checkpointing = False

    def __init__(self, config: CPVTBackboneConfig):
        super().__init__(config)
        on_meta = torch.empty(()).device.type == 'meta'  # transformers' from_pretrained fills the weights next
        self.model = create_model(config.arch, pretrained=None if on_meta else config.pretrained,
                                  **config.model_kwargs())
        self.num_features = [self.model.stage_specs[0].dim, *self.model.out_channels]
        if not on_meta:  # built (or loaded) as create_model does: transformers' init pass keeps it
            for module in self.model.modules():
                module._is_hf_initialized = True
        self.post_init()

    @property
    def stem(self) -> torch.nn.Module:
        """The first patch embedding, whose output is the ``stem`` map."""
        return self.model.patch_embeds[0] if isinstance(self.model, Pyramid) else self.model.patch_embed

    @torch.no_grad()
    def _init_weights(self, module: torch.nn.Module) -> None:
        """What transformers initialises (weights a checkpoint lacked, after ``from_pretrained``): the core's
        initialisation (``models.base.init_weights``) and non-persistent buffers (RoPE-Axial frequencies)."""
        init_weights(module)
        if hasattr(module, 'init_non_persistent_buffers'):
            module.init_non_persistent_buffers()

    def forward(self, pixel_values: torch.Tensor, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None
                ) -> BackboneOutput | tuple:
        """``feature_maps``: the ``out_features`` maps, in ``stage_names`` order; ``hidden_states`` (with
        ``output_hidden_states``): every stage's map, ``stem`` first; ``attentions``: None (``output_attentions``
        raises). ``return_dict=False`` returns ``(feature_maps,)`` or ``(feature_maps, hidden_states)``."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        if output_attentions:
            raise ValueError('CPVT backbones return no attention maps: pass output_attentions=False')
        need_stem = output_hidden_states or 'stem' in self.out_features
        stem: list[tuple[torch.Tensor, tuple[int, int]]] = []
        hook = self.stem.register_forward_hook(lambda module, args, out: stem.append(out)) if need_stem else None
        try:
            maps = tuple(self.model(pixel_values))
        finally:
            if hook is not None:
                hook.remove()
        hidden_states = ((tokens_to_map(*stem[0]).contiguous(),) if need_stem else (None,)) + maps
        feature_maps = tuple(hidden_states[i] for i in self.out_indices)
        hidden_states = hidden_states if output_hidden_states else None
        if not return_dict:
            return (feature_maps,) + ((hidden_states,) if output_hidden_states else ())
        return BackboneOutput(feature_maps=feature_maps, hidden_states=hidden_states, attentions=None)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = 'AutoBackbone') -> None:
        """Does nothing, as ``CPVTBackboneConfig.register_for_auto_class``."""


AutoConfig.register(CPVTBackboneConfig.model_type, CPVTBackboneConfig)
AutoBackbone.register(CPVTBackboneConfig, CPVTBackbone)
