"""Predictions of an OpenMMLab detector or segmentor for each image of a padded batch, as if it were alone at its
own size, at any batch size (``predict_alone``; why a framework's neck and heads need it: docs/reliability.md):
on the batch where every part has a region-exact forward (``adapters.exact``), else image by image after the
backbone.

Three routes lead there: a config's ``type='PredictAlone'`` (``alone_builder``, registered by ``adapters.mmdet``
and ``adapters.mmseg``), through any API that builds the model; ``predict_alone(model)`` for a model built in
Python; ``PredictAloneHook`` for a config that keeps its own model type. The valid-size data preprocessors refuse
a test batch of mixed sizes for any other model (``refuse_mixed_sizes``). Duck typing only: this module imports
nothing from OpenMMLab.
"""
import contextlib
import types
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ..layers.valid import crop_to_image
from .backbones import VALID_SIZES, lazy_builder, register
from .exact import alone_metainfo, batched_backbone, exact_parts, predict_exact


@contextlib.contextmanager
def _given_features(backbone: nn.Module, image: torch.Tensor, features: tuple) -> Iterator[None]:
    """``backbone`` returning ``features`` when it is called on ``image`` itself (the very tensor) while the
    ``with`` block runs, and computing anything else (a sliding window's crop) as usual."""
    def forward(x):
        return features if x is image else type(backbone).forward(backbone, x)
    backbone.forward = forward
    try:
        yield
    finally:
        del backbone.forward


def exact_route(model: nn.Module) -> bool:
    """Whether ``model`` predicts a padded batch on the batch (``exact.exact_parts`` accepts it)."""
    try:
        exact_parts(model)
    except ValueError:
        return False
    return True


def _predict_alone(self, inputs: torch.Tensor, data_samples=None, **kwargs):
    sizes = getattr(inputs, VALID_SIZES, None)
    predict = self.__dict__['predict_batch']
    if sizes is None or data_samples is None:
        return predict(inputs, data_samples, **kwargs)
    if self.__dict__.get('alone_batched', True) and exact_route(self) \
            and not any(s.get('proposals', None) is not None for s in data_samples):
        return predict_exact(self, inputs, data_samples, **kwargs)
    backbone = batched_backbone(self)
    maps = backbone(inputs) if backbone is not None else None
    results = []
    for i, (h, w) in enumerate(sizes.tolist()):
        image = inputs[i:i + 1, :, :h, :w]
        given = contextlib.nullcontext() if maps is None else _given_features(backbone, image, tuple(
            crop_to_image(m[i:i + 1], (h, w), s) for m, s in zip(maps, backbone.strides, strict=True)))
        with given, alone_metainfo(data_samples[i], h, w):
            results += predict(image, data_samples[i:i + 1], **kwargs)
    return results


def predict_alone(model: nn.Module, batched: bool = True) -> nn.Module:
    """Make ``model`` (an mmdet detector or mmseg segmentor, in place; returns it) predict each image of a padded
    batch that carries its images' valid sizes (``inputs.valid_sizes``: the ``ValidSize*DataPreprocessor``\\ s)
    as it predicts that image alone, cropped to its own size. Where every part after the backbone has a
    region-exact forward (``exact_route``) and ``batched``, the whole batch goes through backbone, neck and heads
    at once and only the decoding runs per image (``exact.predict_exact``). Otherwise, or with
    ``batched=False``, our backbone runs once on the batch (exact on each image's region, ``layers.valid``) and
    the neck, heads and post-processing on each image's maps cropped to ceil(h / stride) x ceil(w / stride); a
    model on an engine that runs its backbone, neck and head together runs each cropped image. The image's data
    sample says, while it is predicted, that it fills a batch of its own (``batch_input_shape``, ``pad_shape``
    and any padding sizes), and is set back after. Batches without valid sizes run as before. The original
    ``predict`` stays as ``model.predict_batch``; applying it again only sets ``batched``; the model's data
    preprocessor is marked ``predicts_alone``, so that it takes test batches of mixed sizes
    (``refuse_mixed_sizes``). A ValueError for a model without ``predict``."""
    if not callable(getattr(model, 'predict', None)):
        raise ValueError(f'{type(model).__name__} has no predict method: predict_alone takes an mmdet detector or '
                         'an mmseg segmentor')
    if 'predict_batch' not in vars(model):
        model.__dict__['predict_batch'] = model.predict
        model.predict = types.MethodType(_predict_alone, model)
    model.__dict__['alone_batched'] = bool(batched)
    preprocessor = getattr(model, 'data_preprocessor', None)
    if isinstance(preprocessor, nn.Module):
        preprocessor.predicts_alone = True   # what refuse_mixed_sizes reads
    return model


def alone_builder(registry) -> Callable[..., nn.Module]:
    """The builder a framework registers as ``PredictAlone`` in ``registry`` (its MODELS): a config's
    ``model=dict(type='PredictAlone', model_type='RetinaNet', ...)`` builds the framework's ``model_type`` from
    the other arguments, as ``type=model_type`` would, and returns it, the framework's own class with its own state
    dict and config keys (``model.backbone``...), through ``predict_alone``."""
    def build_predict_alone(model_type: str | None = None, **kwargs) -> nn.Module:
        if not isinstance(model_type, str) or model_type == 'PredictAlone':
            raise ValueError(f"type='PredictAlone' needs model_type, the framework's model type it builds (e.g. "
                             f"'RetinaNet', 'MaskRCNN', 'EncoderDecoder'), got {model_type!r}")
        return predict_alone(registry.build(dict(kwargs, type=model_type)))
    return build_predict_alone


def refuse_mixed_sizes(preprocessor: nn.Module, inputs: torch.Tensor, data_samples) -> None:
    """A ValueError, naming the routes to ``predict_alone``, where a test batch ``inputs`` holds images of
    different sizes (``inputs.valid_sizes``) and the model that owns ``preprocessor`` (a valid-size data
    preprocessor) does not predict alone (``preprocessor.predicts_alone``, which ``predict_alone`` sets)."""
    sizes = getattr(inputs, VALID_SIZES, None)
    if sizes is None or len(sizes) < 2 or getattr(preprocessor, 'predicts_alone', False):
        return
    if all(tuple(s) == tuple(sizes[0]) for s in sizes.tolist()):
        return
    shown = ', '.join(f'{h}x{w}' for h, w in sizes.tolist()[:4]) + (', ...' if len(sizes) > 4 else '')
    raise ValueError(f'{type(preprocessor).__name__}: a test batch of images of different sizes ({shown}) is '
                     "predicted exactly only by a model that predicts each image alone; build it with "
                     "model=dict(type='PredictAlone', model_type=<its type>, ...) in the config, call "
                     "cpvt_backbones.adapters.alone.predict_alone(model), or add dict(type='PredictAloneHook') "
                     'to custom_hooks; or predict one image per batch')


def register_dense(registry, preprocessor: str, make: Callable[[], type]) -> None:
    """What a detection or segmentation framework gets in ``registry`` (its MODELS): our backbones
    (``backbones.register``), ``PredictAlone`` (``alone_builder``) and, under the name ``preprocessor``, its
    valid-size data preprocessor: the class ``make`` returns, made on its first build (``backbones.lazy_builder``)."""
    register(registry)
    registry.register_module(name='PredictAlone', module=alone_builder(registry))
    registry.register_module(name=preprocessor, module=lazy_builder(make))


__all__ = ['alone_builder', 'batched_backbone', 'exact_route', 'predict_alone', 'refuse_mixed_sizes', 'register_dense']
