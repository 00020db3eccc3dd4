"""The OpenMMLab necks and heads computed on a padded batch as each image's maps alone (``layers.region_ops``).

``EXACT_FORWARDS`` maps a module's class name to its region-exact forward ``forward(module, maps, cells)``:
``maps`` the module's inputs (a sequence of (B, C, H, W) maps, zero beyond each image's region), ``cells`` their
regions ((B, 2) int64 each). A forward returns ``(outputs, out_cells)``: the module's own outputs, nested as its
``forward`` nests them, on each image's region what the module gives that image's maps alone (float32 rounding),
zero beyond; and the regions of its output maps, one (B, 2) per map, in the order of the flattened outputs of one
kind (a head's levels). Each uses the module's own layers and weights, in evaluation mode (a BatchNorm in training
mode is refused); a layer it does not know is refused by name. Duck typing only: this module imports nothing
from OpenMMLab.

Covered: mmdet's and mmseg's ``FPN`` (top-down nearest upsampling to each image's own lower level, extra levels
by max pooling or by convolutions on the input, lateral or output), ``RetinaHead`` (GroupNorm over each region),
``RPNHead``, mmseg's ``FPNHead`` (Semantic FPN: each scale head's x2 upsampling from the size it has alone, then
resized to level 0's) and ``UPerHead`` (pyramid pooling of each region, top-down bilinear resizing to each image's
sizes). ``StandardRoIHead``'s entry prepares its inputs: the maps with each image's edge repeated beyond its
region (``region_ops.replicate_edge``), which its RoIAlign then samples as it samples each image's maps alone.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..layers.region_ops import (
    adaptive_avg_pool,
    conv_cells,
    full_cells,
    group_norm,
    replicate_edge,
    resize,
    zero_beyond,
)

Cells = torch.Tensor
EXACT_FORWARDS: dict[str, Callable] = {}
# What a module must satisfy beyond its class for its forward to be exact: ``check(module)`` raises a ValueError.
_CHECKS: dict[str, Callable[[nn.Module], None]] = {}


def _exact(name: str, check: Callable[[nn.Module], None] | None = None):
    def register(forward):
        EXACT_FORWARDS[name] = forward
        if check is not None:
            _CHECKS[name] = check
        return forward
    return register


def refuse_unknown(module: nn.Module, where: str) -> None:
    """A ValueError naming ``module``'s class where no region-exact forward is registered for it
    (``EXACT_FORWARDS``), or naming what it holds that the forward does not compute exactly (a check of its
    registration: a RoI head's RoI layers); ``where`` names its place in the model. A layer found only while
    the forward runs is refused then, by name."""
    name = type(module).__name__
    if name not in EXACT_FORWARDS:
        raise ValueError(f'{where}: {name} has no region-exact forward on a padded batch (known: '
                         f'{", ".join(sorted(EXACT_FORWARDS))})')
    if name in _CHECKS:
        _CHECKS[name](module)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _conv_cells(layer: nn.Module, cells: Cells) -> Cells:
    """The regions ``layer`` (an ``nn.Conv2d`` with zero padding given in pixels; anything else is refused)
    makes of maps of ``cells``."""
    if not isinstance(layer, nn.Conv2d) or layer.padding_mode != 'zeros' or isinstance(layer.padding, str):
        raise ValueError(f'{type(layer).__name__} (padding {getattr(layer, "padding", None)!r}, '
                         f'{getattr(layer, "padding_mode", None)!r}): only an nn.Conv2d with zero padding given in '
                         'pixels is computed on a padded batch')
    return conv_cells(cells, layer.kernel_size, layer.stride, layer.padding, layer.dilation)


def conv(layer: nn.Conv2d, x: torch.Tensor, cells: Cells) -> tuple[torch.Tensor, Cells]:
    """A zero-padded ``nn.Conv2d`` of each image's region: ``layer(x)`` zeroed beyond the regions it makes."""
    out = _conv_cells(layer, cells)
    return zero_beyond(layer(x), out), out


def conv_module(m: nn.Module, x: torch.Tensor, cells: Cells) -> tuple[torch.Tensor, Cells]:
    """mmcv's ``ConvModule`` (conv, norm, act) of each image's region: a GroupNorm's statistics over the region
    (``region_ops.group_norm``); a BatchNorm in evaluation mode and the activation are pointwise."""
    if tuple(m.order) != ('conv', 'norm', 'act') or m.with_explicit_padding:
        raise ValueError(f'ConvModule with order {m.order} and explicit padding {m.with_explicit_padding}: only '
                         "('conv', 'norm', 'act') with the convolution's own zero padding is computed on a padded "
                         'batch')
    norm = m.norm if m.with_norm else None
    if isinstance(norm, nn.GroupNorm):
        y, out = conv(m.conv, x, cells)
        y = group_norm(y, out, norm.num_groups, norm.weight, norm.bias, norm.eps)
        return zero_beyond(m.activate(y), out) if m.with_activation else y, out
    if norm is not None and not (isinstance(norm, nn.modules.batchnorm._BatchNorm) and not norm.training):
        raise ValueError(f'ConvModule norm {type(norm).__name__} (training={norm.training}): only GroupNorm and '
                         'BatchNorm in evaluation mode are computed on a padded batch')
    out = _conv_cells(m.conv, cells)
    return zero_beyond(m(x), out), out


def _layer(m: nn.Module, x: torch.Tensor, cells: Cells) -> tuple[torch.Tensor, Cells]:
    """One layer of a head's stack: a ConvModule, an nn.Conv2d, a ReLU, mmseg's ``Upsample`` (a size from the
    input's, F.interpolate with that size) or an ``nn.Sequential`` of them."""
    name = type(m).__name__
    if name == 'ConvModule':
        return conv_module(m, x, cells)
    if isinstance(m, nn.Conv2d):
        return conv(m, x, cells)
    if isinstance(m, nn.ReLU):
        return m(x), cells
    if isinstance(m, nn.Sequential):
        for layer in m:
            x, cells = _layer(layer, x, cells)
        return x, cells
    if name == 'Upsample' and not isinstance(m, nn.Upsample) and not m.size and m.scale_factor \
            and not isinstance(m.scale_factor, tuple):
        # mmseg's Upsample: size = int(n * scale_factor) of the map it is given, that of each region alone (an
        # integral factor in integers, which a trace keeps symbolic)
        factor = m.scale_factor
        hw = [t * int(factor) if float(factor).is_integer() else int(t * factor) for t in x.shape[-2:]]
        out = torch.floor(cells.to(torch.float64) * factor).to(torch.int64)
        return resize(x, cells, out, hw, m.mode, m.align_corners), out
    raise ValueError(f'{name}: no region-exact forward for this layer of a head')


@_exact('FPN')
def fpn(neck: nn.Module, maps: Sequence[torch.Tensor], cells: Sequence[Cells]):
    """mmdet's or mmseg's ``FPN.forward``: laterals, top-down upsampling of each image's level to its own next
    level's size (``upsample_cfg`` without ``scale_factor``), outputs, extra levels."""
    cfg = dict(neck.upsample_cfg)
    mode, align = cfg.pop('mode', 'nearest'), cfg.pop('align_corners', None)
    if cfg:
        raise ValueError(f'FPN upsample_cfg {neck.upsample_cfg}: only mode and align_corners (a size from the next '
                         'level) are computed on a padded batch')
    start = neck.start_level
    lat = [conv_module(m, maps[i + start], cells[i + start]) for i, m in enumerate(neck.lateral_convs)]
    for i in range(len(lat) - 1, 0, -1):
        (x, c), (low, low_cells) = lat[i], lat[i - 1]
        lat[i - 1] = (low + resize(x, c, low_cells, low.shape[-2:], mode, align), low_cells)
    outs = [conv_module(neck.fpn_convs[i], *lat[i]) for i in range(len(lat))]
    extra = neck.num_outs - len(outs)
    if extra > 0 and not neck.add_extra_convs:
        for _ in range(extra):
            x, c = outs[-1]
            outs.append((nn.functional.max_pool2d(x, 1, stride=2), conv_cells(c, (1, 1), (2, 2), (0, 0))))
    elif extra > 0:
        source = {'on_input': (maps[neck.backbone_end_level - 1], cells[neck.backbone_end_level - 1]),
                  'on_lateral': lat[-1], 'on_output': outs[-1]}[neck.add_extra_convs]
        outs.append(conv_module(neck.fpn_convs[len(lat)], *source))
        for i in range(len(lat) + 1, neck.num_outs):
            x, c = outs[-1]
            outs.append(conv_module(neck.fpn_convs[i], nn.functional.relu(x) if neck.relu_before_extra_convs
                                    else x, c))
    return tuple(x for x, _ in outs), [c for _, c in outs]


@_exact('RetinaHead')
def retina_head(head: nn.Module, maps: Sequence[torch.Tensor], cells: Sequence[Cells]):
    """mmdet's ``RetinaHead.forward``: (cls_scores, bbox_preds), one map per level each."""
    scores, boxes = [], []
    for x, c in zip(maps, cells, strict=True):
        cls_feat = reg_feat = (x, c)
        for m in head.cls_convs:
            cls_feat = conv_module(m, *cls_feat)
        for m in head.reg_convs:
            reg_feat = conv_module(m, *reg_feat)
        scores.append(conv(head.retina_cls, *cls_feat)[0])
        boxes.append(conv(head.retina_reg, *reg_feat)[0])
    return (scores, boxes), list(cells)


@_exact('RPNHead')
def rpn_head(head: nn.Module, maps: Sequence[torch.Tensor], cells: Sequence[Cells]):
    """mmdet's ``RPNHead.forward``: (cls_scores, bbox_preds), one map per level each."""
    scores, boxes = [], []
    for x, c in zip(maps, cells, strict=True):
        x, c = _layer(head.rpn_conv, x, c)
        x = nn.functional.relu(x)
        scores.append(conv(head.rpn_cls, x, c)[0])
        boxes.append(conv(head.rpn_reg, x, c)[0])
    return (scores, boxes), list(cells)


def _roi_extractors(head: nn.Module) -> list[nn.Module]:
    return [head.bbox_roi_extractor] + ([head.mask_roi_extractor] if getattr(head, 'with_mask', False) else [])


def _check_roi_layers(head: nn.Module) -> None:
    """Only mmcv's RoIAlign with ``aligned=True`` (mmdet's default): without it a box is widened to one cell at
    least, which may sample past an image's map alone, where its samples count zero."""
    for extractor in _roi_extractors(head):
        for layer in extractor.roi_layers:
            if type(layer).__name__ != 'RoIAlign' or not getattr(layer, 'aligned', False):
                raise ValueError(f'{type(head).__name__}: a {type(layer).__name__} RoI layer (aligned='
                                 f'{getattr(layer, "aligned", None)}); only RoIAlign (mmcv) with aligned=True reads '
                                 'a padded batch as each image alone')


@_exact('StandardRoIHead', _check_roi_layers)
def standard_roi_head(head: nn.Module, maps: Sequence[torch.Tensor], cells: Sequence[Cells]):
    """The maps mmdet's ``StandardRoIHead`` samples (its extractors' levels), each image's edge repeated beyond
    its region (``region_ops.replicate_edge``); the others as they are. Its RoIAlign (aligned), whose samples
    mmcv clamps to a map's last row and column, reads there what it reads of the image's map alone for a box
    within the image (such a box samples less than ceil(size / stride) cells far)."""
    used = max(e.num_inputs for e in _roi_extractors(head))
    return tuple(replicate_edge(x, c) if i < used else x for i, (x, c) in enumerate(zip(maps, cells, strict=True))), \
        list(cells)


def _decode_inputs(head: nn.Module, maps: Sequence[torch.Tensor], cells: Sequence[Cells]):
    """``BaseDecodeHead._transform_inputs`` for 'multiple_select': the maps (and regions) of ``in_index``."""
    if head.input_transform != 'multiple_select':
        raise ValueError(f'{type(head).__name__} input_transform {head.input_transform!r}: only multiple_select is '
                         'computed on a padded batch')
    return [maps[i] for i in head.in_index], [cells[i] for i in head.in_index]


def _cls_seg(head: nn.Module, x: torch.Tensor, c: Cells) -> torch.Tensor:
    """``BaseDecodeHead.cls_seg`` in evaluation mode (dropout does nothing there)."""
    if head.dropout is not None and head.dropout.training:
        raise ValueError(f'{type(head).__name__} in training mode: the padded-batch forward is an inference one')
    return conv(head.conv_seg, x, c)[0]


@_exact('FPNHead')
def fpn_head(head: nn.Module, maps: Sequence[torch.Tensor], cells: Sequence[Cells]):
    """mmseg's ``FPNHead.forward`` (Semantic FPN): each scale head from the region it has alone (its x2
    upsamplings double that region: level 3 of an image of h rows reaches 8 ceil(h / 32) rows), resized
    (bilinear) to level 0's region, summed, classified: the seg logits of level 0 and its region."""
    xs, cs = _decode_inputs(head, maps, cells)
    out, out_cells = _layer(head.scale_heads[0], xs[0], cs[0])
    for i in range(1, len(head.feature_strides)):
        y, c = _layer(head.scale_heads[i], xs[i], cs[i])
        out = out + resize(y, c, out_cells, out.shape[-2:], 'bilinear', head.align_corners)
    return _cls_seg(head, out, out_cells), [out_cells]


def _ppm(ppm: nn.Module, x: torch.Tensor, c: Cells) -> list[torch.Tensor]:
    """mmseg's ``PPM.forward``: each branch pools each image's region to its bins, convolves the bins and
    resizes them (bilinear) back to the region."""
    outs = []
    for branch in ppm:
        pool, *rest = branch
        if not isinstance(pool, nn.AdaptiveAvgPool2d):
            raise ValueError(f'PPM branch starting with {type(pool).__name__}: only AdaptiveAvgPool2d is computed on '
                             'a padded batch')
        y = adaptive_avg_pool(x, c, _pair(pool.output_size))
        bins = full_cells(y)
        for layer in rest:
            y, bins = _layer(layer, y, bins)
        outs.append(resize(y, bins, c, x.shape[-2:], 'bilinear', ppm.align_corners))
    return outs


@_exact('UPerHead')
def uper_head(head: nn.Module, maps: Sequence[torch.Tensor], cells: Sequence[Cells]):
    """mmseg's ``UPerHead.forward``: laterals, the pyramid pooling module on the last level, top-down bilinear
    resizing of each image's level to its next level's region, the FPN convolutions, every level resized to level
    0's region, the bottleneck, classified: the seg logits of level 0 and its region."""
    xs, cs = _decode_inputs(head, maps, cells)
    lat = [conv_module(m, xs[i], cs[i]) for i, m in enumerate(head.lateral_convs)]
    psp = torch.cat([xs[-1], *_ppm(head.psp_modules, xs[-1], cs[-1])], dim=1)
    lat.append(conv_module(head.bottleneck, psp, cs[-1]))
    for i in range(len(lat) - 1, 0, -1):
        (x, c), (low, low_cells) = lat[i], lat[i - 1]
        lat[i - 1] = (low + resize(x, c, low_cells, low.shape[-2:], 'bilinear', head.align_corners), low_cells)
    outs = [conv_module(head.fpn_convs[i], *lat[i]) for i in range(len(lat) - 1)] + [lat[-1]]
    base, base_cells = outs[0]
    joined = torch.cat([base] + [resize(x, c, base_cells, base.shape[-2:], 'bilinear', head.align_corners)
                                 for x, c in outs[1:]], dim=1)
    feats, c = conv_module(head.fpn_bottleneck, joined, base_cells)
    return _cls_seg(head, feats, c), [c]


__all__ = ['EXACT_FORWARDS', 'conv', 'conv_module', 'refuse_unknown']
