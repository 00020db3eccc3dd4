"""A padded batch through an OpenMMLab detector or segmentor in one go, each image getting what it gets alone.

Our backbone computes the padded batch exactly (``layers.valid``); ``exact_forward`` runs the neck and heads on
the batch too, through their region-exact forwards (``adapters.exact_heads``): one batched computation with no
Python number taken from the sizes, which traces with the sizes as a tensor input. Its outputs are the raw head
maps, zero beyond each image's region, with each map's regions. ``decode_exact`` decodes them per image, each
image's maps cropped to its region (so that anchors lie on its own map) and its data sample saying it fills a
batch of its own, into the data samples the framework's ``predict`` gives that image alone. ``predict_exact`` is
both; ``adapters.alone.predict_alone`` takes this route wherever ``exact_parts`` accepts the model. Duck typing
only: nothing from OpenMMLab is imported.

The models: mmdet's ``RetinaNet`` (single stage: the neck and the bbox head on the batch), ``MaskRCNN`` and
``FasterRCNN`` (the neck and the RPN head on the batch, each image's proposals from its own maps, the RoI head on
the batch's maps with each image's edge repeated beyond its region), mmseg's ``EncoderDecoder`` in 'whole'
inference (the neck and the decode head on the batch; the logits of each image resized from its own region to its
size, then mmseg's post-processing).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from ..layers.region_ops import ceil_cells, resize
from .backbones import VALID_SIZES, _OpenMMLabBackbone
from .exact_heads import EXACT_FORWARDS, refuse_unknown

SINGLE_STAGE = ('RetinaNet',)
TWO_STAGE = ('MaskRCNN', 'FasterRCNN')
SEGMENTORS = ('EncoderDecoder',)

# The metainfo keys that describe a sample's place in a padded batch: its shape, then the padding mmseg crops.
_ALONE_KEYS = ('batch_input_shape', 'pad_shape', 'img_padding_size', 'padding_size')


@contextlib.contextmanager
def alone_metainfo(sample, h: int, w: int) -> Iterator[None]:
    """``sample``'s metainfo saying it fills an (h, w) batch of its own while the ``with`` block runs."""
    meta = sample.metainfo
    old = {key: meta[key] for key in _ALONE_KEYS if key in meta}
    sample.set_metainfo(dict(batch_input_shape=(h, w), pad_shape=(h, w),
                             **{key: [0, 0, 0, 0] for key in _ALONE_KEYS[2:] if key in old}))
    try:
        yield
    finally:
        for key in _ALONE_KEYS:
            if key in old:
                sample.set_metainfo({key: old[key]})
            elif key in sample.metainfo:
                delattr(sample, key)


def batched_backbone(model: nn.Module) -> nn.Module | None:
    """``model``'s backbone where it computes a padded batch exactly and the model calls it (our backbone, its
    feature maps, no engine attached to the whole model: ``deploy.openmmlab.attach_engine``), else None."""
    backbone = getattr(model, 'backbone', None)
    if isinstance(backbone, _OpenMMLabBackbone) and backbone.features_only and 'extract_feat' not in vars(model):
        return backbone
    return None


def exact_parts(model: nn.Module) -> dict[str, nn.Module]:
    """The parts of ``model`` that ``exact_forward`` runs on a padded batch after its backbone, by attribute
    name, in order (a segmentor without a neck has none). A ValueError naming the class where the model is not
    one of ``SINGLE_STAGE``, ``TWO_STAGE`` or ``SEGMENTORS`` (by class name), its backbone does not compute a
    padded batch exactly (``batched_backbone``), a segmentor does not infer 'whole', or a part has no
    region-exact forward (``exact_heads.EXACT_FORWARDS``)."""
    name = type(model).__name__
    if name in SINGLE_STAGE:
        names = ('neck', 'bbox_head')
    elif name in TWO_STAGE:
        names = ('neck', 'rpn_head', 'roi_head')
    elif name in SEGMENTORS:
        mode = model.test_cfg.get('mode', 'whole') if model.test_cfg is not None else 'whole'
        if mode != 'whole':
            raise ValueError(f"{name} with test_cfg mode {mode!r}: only 'whole' inference runs on a padded batch")
        names = (('neck',) if getattr(model, 'with_neck', False) else ()) + ('decode_head',)
    else:
        raise ValueError(f'{name}: no padded-batch route for this model (known: '
                         f'{", ".join(SINGLE_STAGE + TWO_STAGE + SEGMENTORS)})')
    if batched_backbone(model) is None:
        raise ValueError(f'{name}: its backbone ({type(getattr(model, "backbone", None)).__name__}) does not compute '
                         'a padded batch exactly (one of ours, feature maps, no engine attached to the model)')
    parts = {}
    for part in names:
        module = getattr(model, part, None)
        if module is None:
            raise ValueError(f'{name} has no {part}')
        refuse_unknown(module, f'{name}.{part}')
        parts[part] = module
    return parts


def exact_forward(model: nn.Module, inputs: torch.Tensor, sizes: torch.Tensor):
    """The raw outputs of ``model`` (``exact_parts`` accepts it) on the padded batch ``inputs`` of images of
    ``sizes`` ((B, 2) int64, pixels: ``layers.valid.check_valid_sizes``), computed on the batch as each image
    alone: ``(outputs, cells)``, ``cells`` the regions of the output maps, one (B, 2) int64 per level. Every map
    is zero beyond each image's region, but the features of a two-stage model on the levels its RoI head samples,
    which repeat each image's edge there.

    ``outputs``: for a single-stage detector its bbox head's ``(cls_scores, bbox_preds)`` (a list of levels each);
    for a two-stage one ``(features, rpn_cls_scores, rpn_bbox_preds)``, ``features`` the neck's maps as the RoI
    head reads them (each image's edge repeated beyond its region on the levels it samples); for a segmentor the
    decode head's seg logits (B, K, h, w) at its stride."""
    parts = exact_parts(model)
    backbone = model.backbone
    maps = super(_OpenMMLabBackbone, backbone).forward(inputs, valid_sizes=sizes)
    cells = [ceil_cells(sizes, stride) for stride in backbone.strides]
    if 'neck' in parts:
        maps, cells = EXACT_FORWARDS[type(parts['neck']).__name__](parts['neck'], maps, cells)
    if 'bbox_head' in parts:
        return EXACT_FORWARDS[type(parts['bbox_head']).__name__](parts['bbox_head'], maps, cells)
    if 'rpn_head' in parts:
        (scores, boxes), _ = EXACT_FORWARDS[type(parts['rpn_head']).__name__](parts['rpn_head'], maps, cells)
        features, _ = EXACT_FORWARDS[type(parts['roi_head']).__name__](parts['roi_head'], maps, cells)
        return (tuple(features), scores, boxes), cells
    logits, out_cells = EXACT_FORWARDS[type(parts['decode_head']).__name__](parts['decode_head'], maps, cells)
    return logits, out_cells


def _crop(maps: Sequence[torch.Tensor], cells: Sequence[torch.Tensor], b: int) -> list[torch.Tensor]:
    """Image ``b``'s part of each level's map: its region, as a (1, C, h, w) view."""
    out = []
    for m, c in zip(maps, cells, strict=True):
        h, w = c[b].tolist()
        out.append(m[b:b + 1, :, :h, :w])
    return out


def decode_exact(model: nn.Module, outputs, cells: Sequence[torch.Tensor], sizes: torch.Tensor,
                 data_samples: list, rescale: bool = True) -> list:
    """``exact_forward``'s ``outputs`` and ``cells`` for images of ``sizes`` decoded into ``data_samples`` (the
    batch's, one per image; returned, as the framework's ``predict`` returns them): each image's predictions as
    the framework's own decoding gives them for that image alone (its data sample saying, while it is decoded,
    that it fills a batch of its own; set back after). ``rescale``: mmdet's (a segmentor always resizes to the
    original shape). Per image in Python: this is the part an exported file leaves to its caller."""
    name = type(model).__name__
    images = [tuple(hw) for hw in sizes.tolist()]
    if name in SINGLE_STAGE:
        head = model.bbox_head
        results = []
        for b, (sample, (h, w)) in enumerate(zip(data_samples, images, strict=True)):
            with alone_metainfo(sample, h, w):
                results += head.predict_by_feat(*(_crop(level, cells, b) for level in outputs),
                                                batch_img_metas=[sample.metainfo], rescale=rescale)
        return model.add_pred_to_datasample(data_samples, results)
    if name in TWO_STAGE:
        features, scores, boxes = outputs
        with contextlib.ExitStack() as stack:
            for sample, (h, w) in zip(data_samples, images, strict=True):
                stack.enter_context(alone_metainfo(sample, h, w))
            proposals = []
            for b, sample in enumerate(data_samples):
                proposals += model.rpn_head.predict_by_feat(_crop(scores, cells, b), _crop(boxes, cells, b),
                                                            batch_img_metas=[sample.metainfo], rescale=False)
            results = model.roi_head.predict(tuple(features), proposals, data_samples, rescale=rescale)
        return model.add_pred_to_datasample(data_samples, results)
    head = model.decode_head
    logits = resize(outputs, cells[0], sizes, sizes.amax(dim=0).tolist(), 'bilinear', head.align_corners)
    results = []
    for b, (sample, (h, w)) in enumerate(zip(data_samples, images, strict=True)):
        with alone_metainfo(sample, h, w):
            results += model.postprocess_result(logits[b:b + 1, :, :h, :w], [sample])
    return results


def predict_exact(model: nn.Module, inputs: torch.Tensor, data_samples: list, rescale: bool = True) -> list:
    """``model.predict`` of the padded batch ``inputs`` (carrying ``inputs.valid_sizes``, as the valid-size data
    preprocessors attach them) computed on the batch, each image's data sample getting what the image gets alone:
    ``decode_exact(exact_forward(...))``. A ValueError for a batch without valid sizes, or a model
    ``exact_parts`` refuses."""
    sizes = getattr(inputs, VALID_SIZES, None)
    if sizes is None:
        raise ValueError('predict_exact takes a padded batch with its images\' valid sizes (inputs.valid_sizes, '
                         'set by the ValidSize*DataPreprocessors)')
    outputs, cells = exact_forward(model, inputs, sizes)
    return decode_exact(model, outputs, cells, sizes, data_samples, rescale=rescale)


__all__ = ['SEGMENTORS', 'SINGLE_STAGE', 'TWO_STAGE', 'alone_metainfo', 'batched_backbone', 'decode_exact',
           'exact_forward', 'exact_parts', 'predict_exact']
