"""The neck and heads of the dense configs computed on a padded batch give each image what it gets alone
(``adapters.exact``), and the region operations under them reproduce PyTorch's on each image's region alone
(``layers.region_ops``)."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from shapes_models import shapes_model
from torch_features import needs_torch

from cpvt_backbones.layers import region_ops

# (in, out) pairs for one side: upsampling and downsampling by odd ratios, 1 on either side, equal sizes.
PAIRS = [(7, 13), (5, 9), (13, 7), (9, 5), (1, 6), (6, 1), (3, 3), (31, 127), (127, 31), (2, 4)]
RESIZES = [('nearest', None), ('bilinear', False), ('bilinear', True)]


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _maps(cells, hw, channels=3, seed=0):
    """A (B, C, *hw) map, random on each image's region of ``cells`` ((h, w) pairs), zero beyond."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.tensor(cells)
    return region_ops.zero_beyond(torch.randn(len(cells), channels, *hw, generator=g), cells), cells


def _assert_zero_beyond(x, cells):
    assert torch.equal(region_ops.zero_beyond(x, cells), x), 'non-zero beyond an image'


@pytest.mark.parametrize('mode,align_corners', RESIZES, ids=['nearest', 'bilinear', 'bilinear-align'])
def test_resize_is_interpolate_of_each_region(mode, align_corners):
    """Each image of one batch resized from its own size to its own size (every pair of ``PAIRS`` for the rows,
    another for the columns): ``F.interpolate(region, size=out)`` to float32 rounding (nearest: equal)."""
    ins = [(a, c) for (a, _), (c, _) in zip(PAIRS, PAIRS[3:] + PAIRS[:3], strict=True)]
    outs = [(b, d) for (_, b), (_, d) in zip(PAIRS, PAIRS[3:] + PAIRS[:3], strict=True)]
    x, cells = _maps(ins, (130, 130))
    out_cells = torch.tensor(outs)
    y = region_ops.resize(x, cells, out_cells, (131, 129), mode, align_corners)
    for b, ((h, w), (oh, ow)) in enumerate(zip(ins, outs, strict=True)):
        want = F.interpolate(x[b:b + 1, :, :h, :w], size=(oh, ow), mode=mode, align_corners=align_corners)
        torch.testing.assert_close(y[b:b + 1, :, :oh, :ow], want, rtol=0 if mode == 'nearest' else 1e-6,
                                   atol=0 if mode == 'nearest' else 1e-6)
    _assert_zero_beyond(y, out_cells)


@pytest.mark.parametrize('mode', ['nearest', 'bilinear'])
@pytest.mark.parametrize('scale_factor', [2.0, 1.5, 3.0])
def test_resize_with_a_scale_factor_is_interpolate_with_it(mode, scale_factor):
    """With ``scale_factor`` the source positions come from 1 / scale_factor, as F.interpolate's."""
    sides = [(1, 2), (5, 7), (13, 6)]
    x, cells = _maps(sides, (13, 7))
    outs = torch.floor(cells * scale_factor).to(torch.int64)
    y = region_ops.resize(x, cells, outs, (40, 40), mode, False if mode == 'bilinear' else None, scale_factor)
    for b, (h, w) in enumerate(sides):
        want = F.interpolate(x[b:b + 1, :, :h, :w], scale_factor=scale_factor, mode=mode,
                             align_corners=False if mode == 'bilinear' else None)
        assert tuple(want.shape[-2:]) == tuple(outs[b].tolist())
        torch.testing.assert_close(y[b:b + 1, :, :want.shape[2], :want.shape[3]], want, rtol=1e-6, atol=1e-6)


def test_group_norm_takes_each_regions_statistics():
    x, cells = _maps([(1, 1), (7, 23), (20, 30)], (20, 30), channels=8)
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(8, generator=g), torch.randn(8, generator=g)
    y = region_ops.group_norm(x, cells, 4, weight, bias)
    for b, (h, w) in enumerate(cells.tolist()):
        assert _rel(y[b:b + 1, :, :h, :w], F.group_norm(x[b:b + 1, :, :h, :w], 4, weight, bias)) < 1e-6
    _assert_zero_beyond(y, cells)


@pytest.mark.parametrize('bins', [1, 2, 3, 6, (2, 5)])
def test_adaptive_avg_pool_pools_each_region_with_pytorchs_bins(bins):
    """PyTorch's bins over each region, fewer cells than bins included (1 x 1, 5 x 2 into 6)."""
    x, cells = _maps([(1, 1), (5, 2), (7, 13), (20, 30)], (20, 30))
    y = region_ops.adaptive_avg_pool(x, cells, bins)
    for b, (h, w) in enumerate(cells.tolist()):
        torch.testing.assert_close(y[b:b + 1], F.adaptive_avg_pool2d(x[b:b + 1, :, :h, :w], bins),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('aligned', [True, pytest.param(False, marks=pytest.mark.xfail(
    strict=True, reason='a box widened to one cell samples past the map alone, where samples count zero: refused '
                        'by exact_parts (test_a_part_without_an_exact_forward_is_refused_by_name...)'))])
def test_roi_align_reads_the_replicated_edge_as_each_image_alone(aligned):
    """mmcv's RoIAlign (aligned, mmdet's default) of boxes within each image (edges included) on the padded batch
    with each image's edge repeated equals it on each image's map alone, whose samples it clamps to the last row
    and column."""
    ops = pytest.importorskip('mmcv.ops')
    sizes = torch.tensor([[29, 45], [61, 203], [7, 23]])
    stride = 8
    x, cells = _maps(region_ops.ceil_cells(sizes, stride).tolist(), (8, 26), channels=4)
    g = torch.Generator().manual_seed(2)
    boxes = []
    for b, (h, w) in enumerate(sizes.tolist()):
        corners = torch.rand(6, 4, generator=g) * torch.tensor([w, h, w, h])
        lo, hi = torch.minimum(corners[:, :2], corners[:, 2:]), torch.maximum(corners[:, :2], corners[:, 2:])
        hi[:2] = torch.tensor([w, h], dtype=torch.float32)   # two boxes reach the image's bottom-right corner
        boxes.append(torch.cat([torch.full((6, 1), float(b)), lo, hi], dim=1))
    layer = ops.RoIAlign(output_size=7, spatial_scale=1 / stride, sampling_ratio=2, aligned=aligned)
    batched = layer(region_ops.replicate_edge(x, cells), torch.cat(boxes))
    plain = layer(x, torch.cat(boxes))
    for b, (h, w) in enumerate(cells.tolist()):
        rois = boxes[b].clone()
        rois[:, 0] = 0
        alone = layer(x[b:b + 1, :, :h, :w].contiguous(), rois)
        torch.testing.assert_close(batched[6 * b:6 * b + 6], alone, rtol=1e-6, atol=1e-6)
        if b == 0:   # positive control: the zero padding, not the edge, beside the first image
            assert (plain[:6] - alone).abs().max() > 1e-3


# The configs/shapes dense models; one batch of mixed sizes with a tiny image (7 x 23) and a 1 x 1 one where the
# model's raw outputs are compared (the detectors' predictions need some detection to compare: no 1 x 1 there).
CONFIGS = ['retinanet_pcpvt-tiny_fpn_shapes.py', 'mask-rcnn_pcpvt-tiny_fpn_shapes.py', 'fpn_pcpvt-tiny_shapes.py',
           'upernet_pcpvt-tiny_shapes.py']
RAW_SIZES = [(1, 1), (7, 23), (97, 131), (160, 128), (61, 203)]
SIZES = RAW_SIZES[1:]


def _padded(sizes, fill=3., seed=0):
    """Random images of ``sizes`` top-left in one batch, ``fill`` beyond (any value must do)."""
    g = torch.Generator().manual_seed(seed)
    images = [torch.randn(3, h, w, generator=g) for h, w in sizes]
    x = torch.full((len(sizes), 3, max(h for h, _ in sizes), max(w for _, w in sizes)), fill)
    for b, image in enumerate(images):
        x[b, :, :image.shape[1], :image.shape[2]] = image
    return x, images, torch.tensor(sizes)


def _framework_outputs(model, x):
    """What the framework's own modules give after the backbone (the maps ``exact_forward`` returns)."""
    feats = model.extract_feat(x)
    if hasattr(model, 'bbox_head'):
        return model.bbox_head(feats)
    if hasattr(model, 'rpn_head'):
        return (feats, *model.rpn_head(feats))
    return model.decode_head(feats)


def _levels(outputs):
    """The output maps as one flat list of (kind, level) -> map."""
    if isinstance(outputs, torch.Tensor):
        return {('logits', 0): outputs}
    return {(kind, level): m for kind, maps in enumerate(outputs) for level, m in enumerate(maps)}


def _paper_model(config):
    """``configs/<config>`` (a paper config) built with random weights (seed 0, nothing fetched), evaluation mode."""
    import importlib
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    from mmengine.registry import DefaultScope

    from cpvt_backbones.adapters.runner import read_config
    cfg = read_config(str(_ROOT / config))
    cfg.model.backbone.init_cfg = None
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        return importlib.import_module(f'{cfg.default_scope}.registry').MODELS.build(cfg.model).eval()


# One paper config per head (the others build the same modules at other widths: heavy).
PAPER = ['retinanet/retinanet_pcpvt-s_fpn_1x_coco.py', 'mask_rcnn/mask-rcnn_svt-s_fpn_1x_coco.py',
         'sem_fpn/fpn_pvtv2-b0_8xb4-40k_ade20k-512x512.py', 'upernet/upernet_svt-s_8xb2-160k_ade20k-512x512.py']
_ROOT = Path(__file__).resolve().parents[1] / 'configs'
ALL_PAPER = sorted(str(p.relative_to(_ROOT)) for d in ('retinanet', 'mask_rcnn', 'sem_fpn', 'upernet')
                   for p in (_ROOT / d).glob('*.py'))


@pytest.mark.parametrize('config', [c if c in PAPER else pytest.param(c, marks=pytest.mark.heavy)
                                    for c in ALL_PAPER])
def test_every_paper_config_runs_on_the_batch_as_alone(config):
    """Every dense paper config's model takes the batched route (``exact_route``), and its raw outputs on a
    padded batch of two odd sizes equal the framework's on each image alone (relative L2 < 1e-5)."""
    from cpvt_backbones.adapters.alone import exact_route
    from cpvt_backbones.adapters.exact import exact_forward
    model = _paper_model(config)
    assert exact_route(model)
    x, images, sizes = _padded([(97, 131), (61, 75)])
    with torch.no_grad():
        got = _levels(exact_forward(model, x, sizes)[0])
        for b, image in enumerate(images):
            for key, want in _levels(_framework_outputs(model, image[None])).items():
                h, w = want.shape[-2:]
                assert _rel(got[key][b:b + 1, :, :h, :w], want) < 1e-5, (b, key)


@pytest.mark.parametrize('config', CONFIGS)
def test_raw_outputs_on_the_batch_are_each_images_alone(config):
    """``exact_forward`` on a padded batch (1 x 1 to 160 x 128, garbage in the padding): on each image's region
    each output map (every level of every head output, a two-stage model's neck maps) equals the framework's own
    modules on the image alone (relative L2 < 1e-5); zero beyond (the maps the RoI head samples hold each
    image's edge there). Positive control: the framework's modules on the padded batch (our backbone given the
    sizes) are off for the smaller images."""
    from cpvt_backbones.adapters.exact import exact_forward
    model = shapes_model(config)
    x, images, sizes = _padded(RAW_SIZES)
    with torch.no_grad():
        outputs, cells = exact_forward(model, x, sizes)
        x.valid_sizes = sizes
        plain = _levels(_framework_outputs(model, x))
        got = _levels(outputs)
        off = 0.
        for b, image in enumerate(images):
            alone = _levels(_framework_outputs(model, image[None]))
            assert got.keys() == alone.keys()
            for key, want in alone.items():
                h, w = want.shape[-2:]
                level_cells = cells[key[1]]
                assert level_cells[b].tolist() == [h, w], (b, key)
                assert _rel(got[key][b:b + 1, :, :h, :w], want) < 1e-5, (b, key)
                if b < len(images) - 2:
                    off = max(off, _rel(plain[key][b:b + 1, :, :h, :w], want))
        for key, m in got.items():
            if 'rcnn' in config and key[0] == 0 and key[1] < 4:
                torch.testing.assert_close(m, region_ops.replicate_edge(m, cells[key[1]]), rtol=0, atol=0)
            else:
                _assert_zero_beyond(m, cells[key[1]])
    assert off > 1e-3, 'positive control: the framework on the padded batch should be off'


@pytest.mark.parametrize('config', CONFIGS)
def test_predictions_on_the_batch_are_each_images_alone(config):
    """A model built from its config predicts a padded batch (7 x 23 to 160 x 128) through the batched route
    (the per-image loop of ``predict_alone`` is never entered), each image's data sample what it gets alone,
    within the tolerances of docs/reliability.md (``_assert_same_predictions``; Mask R-CNN's masks as
    ``_assert_two_stage_as_alone``)."""
    from test_padded_batches import _assert_same_predictions, _assert_two_stage_as_alone, _predictions, _raw_batch

    from cpvt_backbones.adapters.alone import exact_route
    model = shapes_model(config)
    assert exact_route(model)
    scope = 'mmdet' if 'rcnn' in config or 'retinanet' in config else 'mmseg'
    if 'retinanet' in config:
        model.bbox_head.test_cfg.score_thr = 0.
    batch = _raw_batch(scope, SIZES)
    images = [{k: v[b:b + 1] for k, v in batch.items()} for b in range(len(SIZES))]
    predict_batch = model.__dict__['predict_batch']

    def refuse(*args, **kwargs):
        raise AssertionError('the per-image loop ran')
    model.__dict__['predict_batch'] = refuse
    batched = _predictions(model, batch)
    model.__dict__['predict_batch'] = predict_batch
    for b, image in enumerate(images):
        if 'rcnn' in config:
            _assert_two_stage_as_alone(model, batched[b], image, f'image {b}')
        else:
            (alone,) = _predictions(model, image)
            _assert_same_predictions(scope, batched[b], alone, f'image {b}')


def test_a_part_without_an_exact_forward_is_refused_by_name_and_predicts_image_by_image():
    """``exact_parts`` names the class of a part it has no forward for (a head subclass under another name, a
    model type), and ``predict_alone`` then predicts that model image by image, still as alone."""
    from test_padded_batches import _assert_same_predictions, _predictions, _raw_batch

    from cpvt_backbones.adapters.alone import exact_route
    from cpvt_backbones.adapters.exact import exact_parts
    model = shapes_model('retinanet_pcpvt-tiny_fpn_shapes.py')
    model.bbox_head.test_cfg.score_thr = 0.
    model.bbox_head.__class__ = type('MyRetinaHead', (type(model.bbox_head),), {})
    with pytest.raises(ValueError, match=r'RetinaNet.bbox_head: MyRetinaHead has no region-exact forward'):
        exact_parts(model)
    assert not exact_route(model)
    batch = _raw_batch('mmdet', SIZES[:2])
    batched = _predictions(model, batch)
    for b in range(2):
        (alone,) = _predictions(model, {k: v[b:b + 1] for k, v in batch.items()})
        _assert_same_predictions('mmdet', batched[b], alone, f'image {b}')
    roi = shapes_model('mask-rcnn_pcpvt-tiny_fpn_shapes.py')
    roi.roi_head.mask_roi_extractor.roi_layers[0].aligned = False
    with pytest.raises(ValueError, match=r'StandardRoIHead: a RoIAlign RoI layer \(aligned=False\)'):
        exact_parts(roi)
    other = copy.copy(model)
    other.__class__ = type('MyDetector', (type(model),), {})
    with pytest.raises(ValueError, match=r'MyDetector: no padded-batch route'):
        exact_parts(other)


@pytest.mark.heavy
@needs_torch('export')
@pytest.mark.parametrize('config', CONFIGS)
def test_the_batched_route_exports_with_dynamic_shapes_and_the_sizes_as_input(config):
    """``exact_forward`` through ``torch.export`` with dynamic batch, height and width and the sizes as a tensor
    input (no Python number taken from them), then run at another batch size and shape with a 1 x 1 image:
    the eager outputs and regions exactly (60-100 s each on two shared cores)."""
    from cpvt_backbones.adapters.exact import exact_forward
    from cpvt_backbones.compat import tree_leaves
    model = shapes_model(config)

    class Route(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, sizes):
            return exact_forward(self.model, x, sizes)

    dynamic = torch.export.Dim.DYNAMIC
    x, _, sizes = _padded([(288, 352), (161, 75)])   # no side that torch.export would fix at 1
    with torch.no_grad():
        program = torch.export.export(Route(), (x, sizes), dynamic_shapes=({0: dynamic, 2: dynamic, 3: dynamic},
                                                                           {0: dynamic}), strict=False)
        x, _, sizes = _padded([(300, 270), (33, 47), (1, 1)], seed=1)
        got, want = tree_leaves(program.module()(x, sizes)), tree_leaves(exact_forward(model, x, sizes))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
