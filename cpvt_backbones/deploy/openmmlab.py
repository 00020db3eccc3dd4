"""A whole OpenMMLab model on an inference engine: backbone + neck + head (the tensor-mode forward) run by the
engine, while the model's data preprocessor and post-processing (box decoding and NMS, resizing the logits to
the image) stay the framework's own Python, in float32.

The engine runs ``TensorForward`` (what ``_forward`` of mmdet's single-stage detectors and mmseg's encoder-decoder
segmentors computes, the method their ``mode='tensor'`` calls); ``on_engine`` prepares it on any engine of the
registry that covers the model (``deploy.registry``), or our backbone on one that covers the backbone.
``attach_engine`` makes the model call the engine: ``extract_feat`` returns the engine's
outputs, wrapped, and the head's ``forward`` unwraps them, so ``predict``, ``mode='tensor'`` and the test loops
run unchanged around it. Only duck typing: this module imports nothing from OpenMMLab.
"""
import contextlib
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from ..compat import set_submodule

if TYPE_CHECKING:
    from .registry import EngineRequest


def dense_head(model: nn.Module) -> nn.Module:
    """The head whose forward ends the tensor-mode computation: a single-stage detector's ``bbox_head`` or a
    segmentor's ``decode_head``; anything else is refused by name."""
    if not hasattr(model, 'extract_feat') or not hasattr(model, '_forward'):
        raise ValueError(f'{type(model).__name__} is not an OpenMMLab detector or segmentor (no extract_feat / '
                         '_forward)')
    for staged in ('rpn_head', 'roi_head'):
        if getattr(model, staged, None) is not None:
            raise ValueError(f'{type(model).__name__} has a {staged}: two-stage detectors need the features for '
                             'their second stage, so only single-stage detectors and segmentors run on the engine')
    for name in ('bbox_head', 'decode_head'):
        head = getattr(model, name, None)
        if head is not None:
            return head
    raise ValueError(f'{type(model).__name__} has neither a bbox_head nor a decode_head')


class TensorForward(nn.Module):
    """Backbone, neck and head on a preprocessed batch: the head's ``forward`` on ``extract_feat(inputs)``, as
    ``_forward`` computes it for mmdet's single-stage detectors and mmseg's encoder-decoders (their
    ``mode='tensor'``), as a module of one tensor argument. It computes the model's own forward even once an
    engine is attached to the model (both methods are called through the classes)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        dense_head(model)
        self.model = model
        self.train(model.training)

    def forward(self, inputs: torch.Tensor):
        head = dense_head(self.model)
        return type(head).forward(head, type(self.model).extract_feat(self.model, inputs))


class _ScaleUpsample(nn.Module):
    """An upsampling by an integral factor written with ``scale_factor``, which ``torch.export`` keeps symbolic;
    the same output as computing the size ``int(h * factor)`` in Python, which export would freeze at the
    example's size."""

    def __init__(self, factor: int, mode: str, align_corners: bool | None):
        super().__init__()
        self.factor, self.mode, self.align_corners = factor, mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=self.factor, mode=self.mode, align_corners=self.align_corners)


@contextlib.contextmanager
def exportable(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with its size-computing upsamplers (mmseg's ``Upsample`` with a ``scale_factor``) replaced by
    ``_ScaleUpsample`` while the ``with`` block exports it; put back afterwards."""
    swapped = []
    for name, module in list(model.named_modules()):
        if type(module).__name__ == 'Upsample' and not getattr(module, 'size', None) and \
                getattr(module, 'scale_factor', None) is not None and hasattr(module, 'align_corners'):
            factor = module.scale_factor
            if float(factor) != int(factor):
                raise ValueError(f'{name}: upsampling by {factor} cannot be exported with a dynamic size (only '
                                 'integral factors are)')
            swapped.append((name, module))
            set_submodule(model, name, _ScaleUpsample(int(factor), module.mode, module.align_corners))
    try:
        yield model
    finally:
        for name, module in swapped:
            set_submodule(model, name, module)


class _EngineOutputs(tuple):
    """What ``extract_feat`` returns once the engine runs the model: the head's outputs, already computed."""


def _engine_features(self, inputs: torch.Tensor) -> _EngineOutputs:
    return _EngineOutputs((self.inference_engine(inputs),))


def _engine_head_forward(self, features, *args, **kwargs):
    if not isinstance(features, _EngineOutputs):
        raise TypeError(f'{type(self).__name__} runs on an inference engine; it takes the engine\'s outputs '
                        '(model.extract_feat), not features')
    return features[0]


def attach_engine(model: nn.Module, engine: nn.Module) -> nn.Module:
    """Make ``model`` (in place) run backbone, neck and head through ``engine`` (a module mapping the
    preprocessed batch to ``model._forward``'s outputs), kept as ``model.inference_engine``; returns
    ``model``. The original submodules and the state dict stay as they were: the engine is an attribute, not a
    submodule (``eval()``, ``to()`` and ``state_dict()`` do not reach it)."""
    head = dense_head(model)
    model.__dict__['inference_engine'] = engine   # not a submodule: it may hold the model (torch engine, bf16)
    model.extract_feat = types.MethodType(_engine_features, model)
    head.forward = types.MethodType(_engine_head_forward, head)
    return model


def on_engine(model: nn.Module, engine: 'str | EngineRequest', precision: str = 'fp32',
              calibration: Iterable[torch.Tensor] | None = None, keep_fp32: Sequence[str] = (), **options) -> nn.Module:
    """``model`` (an OpenMMLab model in evaluation mode) on ``engine`` at ``precision`` (or as an
    ``EngineRequest`` asks, given alone), in place, through ``deploy.prepare``; returns ``model``. An engine that
    covers the backbone replaces ``model.backbone``; one that covers the model runs backbone, neck and head
    (``TensorForward``, attached with ``attach_engine``) where it changes anything, and refuses a model that is not
    a single-stage detector or a segmentor. ``calibration``: preprocessed input batches; ``keep_fp32``: names of
    ``model``'s modules whose layers stay float32, renamed here to the names in what the engine runs; ``options``:
    the request's other fields and the engine's own."""
    from .registry import EngineRequest, check_modules, prepare, under
    request = EngineRequest.of(engine, precision, keep_fp32, **options)
    check_modules(model, request.keep_fp32)
    if request.spec.covers == 'backbone':   # what it does not run stays float32 anyway
        keep = ['' if p in ('', 'backbone') else p[len('backbone.'):] for p in request.keep_fp32
                if p == '' or under(p, ['backbone'])]
        prepared = prepare(model.backbone, request.filled(keep_fp32=keep), calibration=calibration)
        set_submodule(model, 'backbone', prepared)
        return model
    try:
        target, whole = TensorForward(model), None
    except ValueError as e:  # not a single-stage detector or a segmentor: an engine may still run it as it is
        target, whole = model, e
    if whole is None:
        request = request.filled(keep_fp32=[f'model.{p}' for p in request.keep_fp32])
    with exportable(model):
        prepared = prepare(target, request, calibration=calibration)
    if prepared is not target:
        if whole is not None:
            raise ValueError(f'engine {request.engine!r} at {request.precision} runs the backbone, neck and head of a '
                             f'detector or segmentor: {whole}')
        attach_engine(model, prepared)
    return model


__all__ = ['TensorForward', 'attach_engine', 'dense_head', 'exportable', 'on_engine']
