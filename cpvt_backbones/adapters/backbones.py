"""The OpenMMLab face of the core models: config-style arguments and ``init_cfg`` loading.

The classes here subclass the torch-only core, so a detector's state dict reads ``backbone.blocks...`` with
the official key names. Registration into a framework's registry happens in the ``mmdet``, ``mmseg`` and
``mmpretrain`` modules beside this one.
"""
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..convert import load_into, load_weights_file, resolve_checkpoint
from ..models import MODEL_SPECS, model_settings
from ..utils import strip_prefix

OUT_TYPES = ('featmap', 'pooled')
VALID_SIZES = 'valid_sizes'   # the attribute of a padded batch that holds each image's valid (h, w)
_PRETRAINED_KEYS = {'type', 'checkpoint', 'prefix', 'map_location'}


def mark_valid_sizes(inputs: torch.Tensor, data_samples: Sequence[Any] | None) -> torch.Tensor:
    """Attach to the padded batch ``inputs`` (in place, as ``inputs.valid_sizes``: a (B, 2) int64 tensor) each
    image's valid size, its data sample's ``img_shape`` (the image before the batch was padded), where some image
    is smaller than the batch; otherwise, or without data samples, remove any. Returns ``inputs``. Our backbones
    read it (the batch is computed as if each image were alone, ``layers.valid``); anything else ignores it, and
    a new tensor made from ``inputs`` (a crop, a resize) does not carry it."""
    sizes = None
    if data_samples:
        shapes = [tuple(int(n) for n in sample.metainfo['img_shape'][:2]) for sample in data_samples]
        if any(shape != tuple(inputs.shape[-2:]) for shape in shapes):
            sizes = torch.tensor(shapes, dtype=torch.int64, device=inputs.device)
    if sizes is not None:
        setattr(inputs, VALID_SIZES, sizes)
    elif hasattr(inputs, VALID_SIZES):
        delattr(inputs, VALID_SIZES)
    return inputs


def lazy_builder(make: Callable[[], type]) -> Callable[..., Any]:
    """A builder to register in a framework's MODELS under a class's name: it builds the class ``make()``
    returns (cached by the caller), made on the first build, not at registration. The builder's docstring is
    ``make``'s."""
    # Made at registration, the framework's modules it needs would import the framework's whole model zoo.
    def build(**kwargs):
        return make()(**kwargs)
    build.__doc__ = make.__doc__
    return build


class _OpenMMLabBackbone:
    """Mixin placed before a core model class. ``arch`` is a model name or a dict of that class's
    constructor arguments (``base='<name>'`` starts from a named variant). A config's ``optimize`` is refused,
    naming the engine route (``adapters.engines``)."""

    def _setup(self, arch: str | Mapping[str, Any], out_indices: Sequence[int] | None, out_type: str,
               drop_path_rate: float, frozen_stages: int, with_cp: bool, init_cfg: dict | None,
               optimize: Any) -> None:
        if optimize is not None:
            raise ValueError(f'optimize={optimize!r}: the backbone takes no inference engine; the fused CPU path and '
                             'the other engines are applied once the checkpoint is loaded (tools/test.py and '
                             "tools/infer.py --engine fused|torch|openvino|onnxruntime, or adapters.custom_hooks."
                             'set_engine(cfg, ...) for a test loop); remove optimize from the config')
        families = {spec.cls for spec in MODEL_SPECS.values()}
        core_cls = next(c for c in type(self).__mro__ if c in families)
        if out_type not in OUT_TYPES:
            raise ValueError(f'out_type must be one of {OUT_TYPES}, got {out_type!r}')
        if out_type == 'pooled' and out_indices is not None:
            raise ValueError("out_type='pooled' returns one pooled feature; leave out_indices unset")
        fixed: dict[str, Any] = dict(
            features_only=out_type == 'featmap', out_indices=out_indices, num_classes=0,
            drop_path_rate=drop_path_rate, frozen_stages=frozen_stages, grad_checkpointing=with_cp)
        settings = model_settings(arch, core_cls)
        clash = sorted(set(settings) & set(fixed))
        if clash:
            raise ValueError(f'{clash} are arguments of the backbone itself, not of arch; set them next to arch')
        core_cls.__init__(self, **settings, **fixed)
        if init_cfg is not None:
            if not isinstance(init_cfg, Mapping) or init_cfg.get('type') != 'Pretrained':
                raise ValueError("init_cfg must be None or dict(type='Pretrained', checkpoint=PATH[, prefix=...]); "
                                 f'the models initialise themselves otherwise; got {init_cfg!r}')
            extra = sorted(set(init_cfg) - _PRETRAINED_KEYS)
            if extra or 'checkpoint' not in init_cfg:
                raise ValueError(f'Pretrained init_cfg takes checkpoint (required), prefix, map_location; '
                                 f'got {sorted(init_cfg)}')
        self.init_cfg = init_cfg
        self.is_init = False

    def init_weights(self) -> None:
        """Load ``init_cfg``'s checkpoint strictly through the key converters (a missing, unexpected or
        mis-shaped key is an error that lists them). ``checkpoint`` is a file, a URL or a model name with
        published weights (both fetched once into the cache and checked: ``cpvt_backbones.convert.hub``).
        Without ``init_cfg`` the constructor's init stands."""
        if self.init_cfg is not None:
            path = str(resolve_checkpoint(str(self.init_cfg['checkpoint'])))
            state = load_weights_file(path)
            prefix = self.init_cfg.get('prefix')
            if prefix:
                state = strip_prefix(state, prefix, path)
            load_into(self, state, strict=True, source=path)
        self.is_init = True

    def forward(self, x: torch.Tensor):
        """The core model's outputs (as a 1-tuple for ``out_type='pooled'``); a batch that carries its images'
        valid sizes (``x.valid_sizes``, set by ``mark_valid_sizes``: the data preprocessors of
        ``adapters.mmdet`` and ``adapters.mmseg``) is computed image by image as if each were alone."""
        out = super().forward(x, valid_sizes=getattr(x, VALID_SIZES, None))
        return out if self.features_only else (out,)


def _backbone_class(core_cls: type, names: Sequence[str], default: str) -> type:
    """The OpenMMLab backbone of the core family ``core_cls``: ``_OpenMMLabBackbone`` before it, under the same
    class name, with the config-style constructor below."""
    def __init__(self, arch: str | Mapping[str, Any] = default, out_indices: Sequence[int] | None = None,
                 out_type: str = 'featmap', drop_path_rate: float = 0., frozen_stages: int = -1,
                 with_cp: bool = False, init_cfg: dict | None = None, optimize: None = None):
        self._setup(arch, out_indices, out_type, drop_path_rate, frozen_stages, with_cp, init_cfg, optimize)

    name = core_cls.__name__
    doc = (f"{name} (``models.{name}``) for mmdet/mmseg/mmpretrain. ``arch``: one of {', '.join(names)} (default "
           f"{default}) or a dict of ``{name}``'s arguments (``base='<name>'`` starts from a named variant). "
           "``out_type='featmap'`` (dense tasks) returns NCHW maps at strides 4/8/16/32 for ``out_indices`` "
           "(default all four; a columnar model's simple feature pyramid); ``'pooled'`` (classification, "
           "``neck=None``) the final-normed pooled feature (or class token) ``(B, C)`` as a 1-tuple. "
           "``drop_path_rate``, ``frozen_stages``: the core model's; ``with_cp``: its ``grad_checkpointing``; "
           "``init_cfg``: ``dict(type='Pretrained', checkpoint=...)`` (``init_weights``); ``optimize``: refused "
           "(see ``_OpenMMLabBackbone``).")
    __init__.__qualname__ = f'{name}.__init__'
    return type(name, (_OpenMMLabBackbone, core_cls),
                {'__init__': __init__, '__doc__': doc, '__module__': __name__, '__qualname__': name})


def _backbone_classes() -> dict[str, type]:
    """One OpenMMLab backbone per family of ``models.MODEL_SPECS`` (in their order), by class name; a family's
    default ``arch`` is its spec marked ``default``."""
    classes = {}
    for family in dict.fromkeys(spec.cls for spec in MODEL_SPECS.values()):
        names = [name for name, spec in MODEL_SPECS.items() if spec.cls is family]
        default = [name for name in names if MODEL_SPECS[name].default]
        if len(default) != 1:
            raise RuntimeError(f'{family.__name__}: exactly one of {names} must be the default, got {default}')
        classes[family.__name__] = _backbone_class(family, names, default[0])
    return classes


# Registered in each framework's MODELS by the ``mmdet``, ``mmseg`` and ``mmpretrain`` modules; a new family of
# ``models.MODEL_SPECS`` gets its class here without a line of its own. Each is also a name of this module, so
# that a pickled model finds its class.
BACKBONES = _backbone_classes()
globals().update(BACKBONES)


def register(registry) -> None:
    """Our backbones (``BACKBONES``) in a framework's ``registry`` (its MODELS), under their class names."""
    for backbone in BACKBONES.values():
        registry.register_module(module=backbone)
