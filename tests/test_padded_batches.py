"""A batch padded to a common size, with each image's valid size, gives every image what it gets alone: every
model family, every registered position encoding, outputs and gradients, and the fused engine."""
import pytest
import torch
from shapes_models import shapes_model
from two_stage_alone import TWO_STAGE, pairing

from cpvt_backbones import prepare
from cpvt_backbones.layers.position import ENCODINGS
from cpvt_backbones.models import CPVT, PyramidCPVT, TwinsSVT

# One batch: a 1 x 1 image beside two odd sizes; the batch is padded to the largest.
SIZES = [(1, 1), (97, 131), (224, 160)]
PYRAMID = dict(embed_dims=(16, 32, 48, 64), num_heads=(1, 2, 3, 4), depths=(2, 2, 2, 2), mlp_ratios=(2, 2, 2, 2))
COLUMNAR = dict(embed_dim=64, depth=6, num_heads=2)
WINDOWED_ENCODINGS = [n for n in ENCODINGS if n != 'rpe']   # a logit bias has no place in windows


def _images(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g) for h, w in sizes]


def _padded(images, fill=0.):
    """The images top-left in one batch; the rest ``fill`` (a framework pads with zeros, any value must do)."""
    H, W = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
    x = torch.full((len(images), 3, H, W), fill)
    for b, image in enumerate(images):
        x[b, :, :image.shape[1], :image.shape[2]] = image
    return x


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _assert_as_alone(model, images, sizes):
    """Each image's output in the padded batch equals its output alone (relative L2 < 1e-5), and every output
    is zero beyond the image."""
    with torch.no_grad():
        batched = model(_padded(images, fill=3.), valid_sizes=sizes)
        for b, image in enumerate(images):
            alone = model(image[None])
            if isinstance(alone, tuple):
                for level, (out, ref) in enumerate(zip(batched, alone, strict=True)):
                    h, w = ref.shape[-2:]
                    assert _rel(out[b:b + 1, :, :h, :w], ref) < 1e-5, (b, level)
                    beyond = out[b].clone()
                    beyond[:, :h, :w] = 0
                    assert not beyond.any(), f'image {b}, level {level}: non-zero beyond the image'
            else:
                assert _rel(batched[b:b + 1], alone) < 1e-5, b


@pytest.mark.parametrize('features_only', [True, False], ids=['features', 'classifier'])
@pytest.mark.parametrize('encoding', list(ENCODINGS))
def test_pyramid_as_alone_for_every_encoding(encoding, features_only):
    torch.manual_seed(0)
    kwargs = dict(features_only=True, num_classes=0) if features_only else dict(num_classes=10)
    model = PyramidCPVT(**PYRAMID, pos_encoding=encoding, **kwargs).eval()
    _assert_as_alone(model, _images(SIZES), SIZES)


@pytest.mark.parametrize('window_mask', [True, False], ids=['masked', 'unmasked'])
@pytest.mark.parametrize('encoding', WINDOWED_ENCODINGS)
def test_svt_as_alone_for_every_encoding(encoding, window_mask):
    torch.manual_seed(0)
    model = TwinsSVT(**PYRAMID, window_mask=window_mask, pos_encoding=encoding, features_only=True,
                     num_classes=0).eval()
    _assert_as_alone(model, _images(SIZES), SIZES)


@pytest.mark.parametrize('class_token', [True, False], ids=['cls', 'gap'])
@pytest.mark.parametrize('encoding', list(ENCODINGS))
def test_columnar_as_alone_for_every_encoding(encoding, class_token):
    torch.manual_seed(0)
    for kwargs in (dict(features_only=True, num_classes=0), dict(num_classes=10)):
        model = CPVT(**COLUMNAR, class_token=class_token, pos_encoding=encoding, **kwargs).eval()
        _assert_as_alone(model, _images(SIZES), SIZES)


@pytest.mark.parametrize('padding_mode', ['circular', 'replicate', 'reflect'])
def test_peg_padding_modes_use_each_images_own_border(padding_mode):
    """A PEG padded otherwise than with zeros pads each image's own map (reflect needs two tokens a side)."""
    sizes = [(64, 64), (97, 131), (224, 160)]
    torch.manual_seed(0)
    model = PyramidCPVT(**PYRAMID, pos_encoding=dict(type='peg', padding_mode=padding_mode),
                        features_only=True, num_classes=0).eval()
    _assert_as_alone(model, _images(sizes), sizes)


@pytest.mark.parametrize('family', ['pcpvt', 'svt', 'cpvt'])
def test_training_gradients_of_each_image_equal_its_gradients_alone(family):
    """In training mode (no dropout), the gradients of a loss on one image of the padded batch equal those of the
    image alone, for every parameter (relative L2 over all of them < 1e-5; each within 1e-6 of the largest)."""
    torch.manual_seed(0)
    model = {'pcpvt': lambda: PyramidCPVT(**PYRAMID, pos_encoding='learned+peg', features_only=True, num_classes=0),
             'svt': lambda: TwinsSVT(**PYRAMID, window_mask=True, pos_encoding='rope_mixed+peg', num_classes=10),
             'cpvt': lambda: CPVT(**COLUMNAR, class_token=False, pos_encoding='rpe+peg', num_classes=10)}[family]()
    model.train()
    images = _images(SIZES)
    x = _padded(images)

    def gradients(inputs, b, **kwargs):
        model.zero_grad()
        out = model(inputs, **kwargs)
        sum(o[b].square().sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
        return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                          for p in model.parameters()])

    for b, image in enumerate(images):
        alone, batched = gradients(image[None], 0), gradients(x, b, valid_sizes=SIZES)
        assert alone.norm() > 0
        assert _rel(batched, alone) < 1e-5, b
        assert (batched - alone).abs().max() <= 1e-6 * alone.abs().max(), b


def test_forward_intermediates_and_features_as_alone():
    torch.manual_seed(0)
    images = _images(SIZES)
    x = _padded(images)
    for model in (PyramidCPVT(**PYRAMID, num_classes=10).eval(), CPVT(**COLUMNAR, num_classes=10).eval()):
        with torch.no_grad():
            final, maps = model.forward_intermediates(x, valid_sizes=SIZES)
            tokens = model.forward_features(x, valid_sizes=SIZES)
            head = model.forward_head(tokens, valid_sizes=SIZES)
            assert torch.equal(final, tokens)
            for b, image in enumerate(images):
                _, maps_alone = model.forward_intermediates(image[None])
                for out, ref in zip(maps, maps_alone, strict=True):
                    assert _rel(out[b:b + 1, :, :ref.shape[-2], :ref.shape[-1]], ref) < 1e-5
                assert _rel(head[b:b + 1], model(image[None])) < 1e-5


def test_fused_engine_takes_valid_sizes():
    torch.manual_seed(0)
    images = _images(SIZES)
    for model in (PyramidCPVT(**PYRAMID, num_classes=10).eval(), TwinsSVT(**PYRAMID, num_classes=10).eval()):
        fused = prepare(model, 'fused')
        with torch.no_grad():
            batched = fused(_padded(images), valid_sizes=SIZES)
            for b, image in enumerate(images):
                assert _rel(batched[b:b + 1], model(image[None])) < 1e-5


def test_a_batch_without_valid_sizes_is_the_padded_images():
    """Without ``valid_sizes`` a padded batch is what it is: its padding takes part (hence the argument)."""
    torch.manual_seed(0)
    model = PyramidCPVT(**PYRAMID, num_classes=10).eval()
    images = _images(SIZES)
    with torch.no_grad():
        assert _rel(model(_padded(images))[1:2], model(images[1][None])) > 1e-3


@pytest.mark.parametrize('sizes, error, match', [
    ([(1, 1), (97, 131)], ValueError, r'each of the 3 images, shape \(3, 2\)'),
    ([(0, 5), (97, 131), (224, 160)], ValueError, 'within 1..224'),
    ([(1, 1), (97, 161), (224, 160)], ValueError, r'1..160 \(width\)'),
    (torch.ones(3, 2), TypeError, 'integers'),
    ([(1, 1.5), (2, 2), (3, 3)], TypeError, 'pairs of ints'),
    (5, TypeError, r'\(B, 2\) tensor or a sequence'),
    (torch.ones(3, 2, dtype=torch.int64, device='meta'), ValueError, 'a tensor on the meta device'),
])
def test_bad_valid_sizes_are_refused_by_name(sizes, error, match):
    model = PyramidCPVT(**PYRAMID, num_classes=10).eval()
    with pytest.raises(error, match=match):
        model(torch.zeros(3, 3, 224, 160), valid_sizes=sizes)


@pytest.mark.parametrize('config', ['retinanet_pcpvt-tiny_fpn_shapes.py', 'fpn_pcpvt-tiny_shapes.py'])
def test_openmmlab_preprocessors_hand_the_backbone_each_images_valid_size(config):
    """mmdet's and mmseg's valid-size data preprocessors (registered by the adapters) pad a batch of odd sizes
    (mmseg's own refuses one at test time), record each image's padding for the post-processing, and attach the
    images' sizes to the batch, so that the backbone's maps of each image equal its maps alone."""
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    import copy
    import importlib
    from pathlib import Path

    from mmengine.registry import DefaultScope

    from cpvt_backbones.adapters.runner import read_config
    cfg = read_config(str(Path(__file__).resolve().parents[1] / 'configs' / 'shapes' / config))
    scope = cfg.default_scope
    cfg.model.data_preprocessor.type = 'ValidSizeDetDataPreprocessor' if scope == 'mmdet' else \
        'ValidSizeSegDataPreprocessor'
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(scope):
        model = importlib.import_module(f'{scope}.registry').MODELS.build(cfg.model).eval()
    sizes = [(61, 75), (97, 131), (160, 224)]
    structures = importlib.import_module(f'{scope}.structures')
    sample = structures.DetDataSample if scope == 'mmdet' else structures.SegDataSample
    g = torch.Generator().manual_seed(1)
    batch = dict(inputs=[torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes],
                 data_samples=[sample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1., 1.)))
                               for h, w in sizes])
    with torch.no_grad():
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        assert data['inputs'].valid_sizes.tolist() == [list(s) for s in sizes]
        if scope == 'mmseg':
            assert [s.img_padding_size for s in data['data_samples']] == [(0, 224 - w, 0, 160 - h) for h, w in sizes]
        maps = model.backbone(data['inputs'])
        for b in range(len(sizes)):
            alone = model.data_preprocessor({k: [copy.deepcopy(v[b])] for k, v in batch.items()}, False)
            assert not hasattr(alone['inputs'], 'valid_sizes')   # nothing padded: the plain path
            for out, ref in zip(maps, model.backbone(alone['inputs']), strict=True):
                assert _rel(out[b:b + 1, :, :ref.shape[-2], :ref.shape[-1]], ref) < 1e-5


DENSE_SIZES = [(61, 75), (97, 131), (160, 224), (33, 47)]


def _raw_batch(scope, sizes, seed=1):
    """Raw uint8 images of ``sizes`` with their data samples, as a test dataloader hands them over."""
    import importlib
    structures = importlib.import_module(f'{scope}.structures')
    sample = structures.DetDataSample if scope == 'mmdet' else structures.SegDataSample
    g = torch.Generator().manual_seed(seed)
    return dict(inputs=[torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes],
                data_samples=[sample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1., 1.)))
                              for h, w in sizes])


def _predictions(model, batch):
    import copy
    with torch.no_grad():
        return model.test_step(copy.deepcopy(batch))


# What docs/reliability.md states of a detection in a padded batch against the image alone: a one-stage detector's
# scores and boxes (px), and a two-stage one's (TWO_STAGE, from two_stage_alone), whose second stage samples the maps
# at the first stage's float boxes; a two-stage mask pixel differs only where the alone probability is within
# MASK_MARGIN of the threshold.
ONE_STAGE = dict(score=1e-5, box=1e-3)
# A segmentation pixel may take another label only where its two best logits alone lie within TIE of the largest
# logit's magnitude of each other (float32 rounding of a batched and a single-image computation orders a near tie
# either way; seen on torch 2.1 for UperNet with random weights).
TIE = 1e-5
MASK_MARGIN = 5e-3


def _assert_same_predictions(scope, got, want, what, score=ONE_STAGE['score'], box=ONE_STAGE['box']):
    """Detections: the same ones (``_pairing``: labels equal, scores within ``score``, boxes within ``box`` px);
    segmentations: logits within relative L2 1e-5 and the same label map but at near ties (``TIE``). Returns the
    pairing (None for a segmentation)."""
    if scope == 'mmdet':
        return _pairing(got.pred_instances, want.pred_instances, what, score, box)
    assert _rel(got.seg_logits.data, want.seg_logits.data) < 1e-5, what
    differ = got.pred_sem_seg.data[0] != want.pred_sem_seg.data[0]
    top2 = want.seg_logits.data.topk(2, dim=0).values
    ties = (top2[0] - top2[1]) <= TIE * want.seg_logits.data.abs().amax()
    assert not (differ & ~ties).any(), f'{what}: {int(differ.sum())} pixel(s) of another label, ' \
                                       f'{int((differ & ~ties).sum())} of them not at a near tie'
    return None


def _pairing(a, b, what, score, box):
    """``two_stage_alone.pairing`` (the same detections, in order but for near ties), asserted."""
    order = pairing(a, b, score, box)
    assert len(a) == len(b) > 0 and order is not None, f'{what}: other detections ({len(a)} against {len(b)} alone)'
    return order


def _assert_two_stage_as_alone(model, got, image_batch, what, margin=MASK_MARGIN):
    """``got``, a two-stage detector's prediction of the one image of ``image_batch`` in a padded batch, is its
    prediction alone within ``TWO_STAGE`` (``_assert_same_predictions``), and each of its masks lies between the
    alone masks at the threshold plus and minus ``margin``: a pixel differs from the alone mask only where the
    alone probability is within ``margin`` of the threshold."""
    test_cfg = model.roi_head.test_cfg
    threshold = test_cfg.mask_thr_binary
    (alone,) = _predictions(model, image_batch)
    order = _assert_same_predictions('mmdet', got, alone, what, **TWO_STAGE)
    try:
        test_cfg.mask_thr_binary = threshold - margin
        (wide,) = _predictions(model, image_batch)
        test_cfg.mask_thr_binary = threshold + margin
        (narrow,) = _predictions(model, image_batch)
    finally:
        test_cfg.mask_thr_binary = threshold
    masks = got.pred_instances.masks
    assert masks.shape == alone.pred_instances.masks.shape, what
    wide, narrow = wide.pred_instances.masks[order], narrow.pred_instances.masks[order]
    extra, missing = int((masks & ~wide).sum()), int((narrow & ~masks).sum())
    assert extra == missing == 0, (f'{what}: {extra} mask pixels set where alone is below the threshold - {margin}, '
                                   f'{missing} unset where it is above the threshold + {margin}')


@pytest.mark.parametrize('config', ['retinanet_pcpvt-tiny_fpn_shapes.py', 'mask-rcnn_pcpvt-tiny_fpn_shapes.py',
                                    'upernet_pcpvt-tiny_shapes.py'])
def test_detectors_and_segmentors_predict_each_image_as_alone(config):
    """A model built from a config (type 'PredictAlone'), through ``model.test_step``: each image of a padded
    batch of four odd sizes gets the prediction it gets alone, for a one- and a two-stage detector (each within its
    tolerance, Mask R-CNN's masks too) and a segmentor (random weights, RetinaNet's score threshold at 0 so that
    there is something to compare; Semantic FPN and the frameworks' inference APIs below). The data samples are
    left as they were."""
    model = shapes_model(config)   # skips without mmdet and mmseg
    scope = 'mmdet' if 'rcnn' in config or 'retinanet' in config else 'mmseg'
    if 'retinanet' in config:
        model.bbox_head.test_cfg.score_thr = 0.
    batch = _raw_batch(scope, DENSE_SIZES)
    batched = _predictions(model, batch)
    for b in range(len(DENSE_SIZES)):
        image = {k: v[b:b + 1] for k, v in batch.items()}
        if 'rcnn' in config:
            _assert_two_stage_as_alone(model, batched[b], image, f'image {b}')
        else:
            (alone,) = _predictions(model, image)
            _assert_same_predictions(scope, batched[b], alone, f'image {b}')
    data = model.data_preprocessor(batch, False)
    before = [dict(s.metainfo) for s in data['data_samples']]
    model.predict(data['inputs'], data['data_samples'])
    assert [s.metainfo for s in data['data_samples']] == before   # set back
    if 'upernet' in config:   # positive control: the same batch through mmseg's own predict is off
        import copy
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        plain = model.predict_batch(data['inputs'], data['data_samples'])
        assert _rel(plain[0].seg_logits.data, batched[0].seg_logits.data) > 1e-2


@pytest.mark.xfail(tuple(int(v) for v in torch.__version__.split('.')[:2]) < (2, 5), strict=False,
                   reason='measured on torch 2.14 only; on torch 2.1.2 one of the eight images (random weights) '
                          'gives its detections in another order or set in the batch, not yet explained')
def test_mask_rcnn_predicts_shapes_scenes_in_batches_of_eight_as_alone():
    """Mask R-CNN (random weights) on eight shapes scenes of eight sizes at the training scale, in one padded
    batch as the demo evaluates them: each image's detections within ``TWO_STAGE`` of its detections alone, and
    its masks between the alone masks at the threshold plus and minus ``MASK_MARGIN`` (docs/reliability.md; the
    margins measured over 96 scenes by tests/two_stage_alone.py)."""
    from two_stage_alone import batch_of, scenes
    model = shapes_model('mask-rcnn_pcpvt-tiny_fpn_shapes.py')
    images = scenes(8)
    assert len({tuple(i.shape) for i in images}) == 8   # every image padded but the largest
    batched = _predictions(model, batch_of('mmdet', images))
    for b, image in enumerate(images):
        _assert_two_stage_as_alone(model, batched[b], batch_of('mmdet', [image]), f'image {b}')


def _plain_type(config):
    """``config``'s model built with the framework's own type (no 'PredictAlone'), seed 0, evaluation mode."""
    import importlib
    from pathlib import Path

    from mmengine.registry import DefaultScope

    from cpvt_backbones.adapters.runner import read_config
    cfg = read_config(str(Path(__file__).resolve().parents[1] / 'configs' / 'shapes' / config))
    cfg.model.type = cfg.model.pop('model_type')
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        return importlib.import_module(f'{cfg.default_scope}.registry').MODELS.build(cfg.model).eval()


@pytest.mark.parametrize('config', ['retinanet_pcpvt-tiny_fpn_shapes.py', 'fpn_pcpvt-tiny_shapes.py'])
def test_a_model_of_another_type_predicts_alone_through_the_hook_and_is_refused_without(config):
    """A config that keeps the framework's model type with a valid-size preprocessor: a test batch of mixed sizes
    is refused by name (its neck and heads would answer otherwise); one size, or one image, runs; with
    ``PredictAloneHook`` (as a test loop runs it) each image is predicted as alone."""
    from types import SimpleNamespace
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    from cpvt_backbones.adapters.hooks import PredictAloneHook
    model = _plain_type(config)
    assert 'predict_batch' not in vars(model)
    scope = 'mmdet' if 'retinanet' in config else 'mmseg'
    batch = _raw_batch(scope, DENSE_SIZES[:3])
    with pytest.raises(ValueError, match=r"different sizes \(61x75, 97x131, 160x224\).*type='PredictAlone'"):
        _predictions(model, batch)
    _predictions(model, _raw_batch(scope, [DENSE_SIZES[1]] * 2))   # one size: nothing to refuse
    _predictions(model, _raw_batch(scope, DENSE_SIZES[:1]))
    PredictAloneHook().before_test(SimpleNamespace(model=model))
    if scope == 'mmdet':
        model.bbox_head.test_cfg.score_thr = 0.
    batched = _predictions(model, batch)
    for b in range(3):
        (alone,) = _predictions(model, {k: v[b:b + 1] for k, v in batch.items()})
        _assert_same_predictions(scope, batched[b], alone, f'image {b}')


def test_predict_alone_type_names_its_model_type():
    pytest.importorskip('mmdet')
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope

    import cpvt_backbones.adapters.mmdet  # noqa: F401
    with DefaultScope.overwrite_default_scope('mmdet'), pytest.raises(ValueError, match='needs model_type'):
        MODELS.build(dict(type='PredictAlone', backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny')))


# Three images of the sizes the issue measured, as the frameworks' inference APIs take them (H x W x 3 uint8).
API_SIZES = [(97, 131), (160, 128), (61, 203)]


def _arrays(seed=2):
    import numpy as np
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in API_SIZES]


def _config(name):
    from pathlib import Path
    return str(Path(__file__).resolve().parents[1] / 'configs' / 'shapes' / name)


def test_mmseg_inference_apis_predict_each_image_as_alone():
    """mmseg's ``init_model`` + ``inference_model`` on a list of images of three sizes, and ``MMSegInferencer``
    with ``batch_size=8``, on a config's model (random weights): each image's logits and labels are those it gets
    alone (mmseg alone would refuse such a batch)."""
    pytest.importorskip('mmseg')
    import warnings

    from mmseg.apis import MMSegInferencer, inference_model, init_model
    images = _arrays()
    torch.manual_seed(0)
    model = init_model(_config('fpn_pcpvt-tiny_shapes.py'), device='cpu')
    batched = inference_model(model, images)
    assert len({tuple(r.seg_logits.shape[-2:]) for r in batched}) == 3
    for b, image in enumerate(images):
        _assert_same_predictions('mmseg', batched[b], inference_model(model, image), f'image {b}')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')   # no checkpoint: random weights, Cityscapes' names
        inferencer = MMSegInferencer(_config('fpn_pcpvt-tiny_shapes.py'), device='cpu')
    batched = inferencer(images, batch_size=8, return_datasamples=True)
    for b, image in enumerate(images):
        alone = inferencer(image, batch_size=1, return_datasamples=True)
        _assert_same_predictions('mmseg', batched[b], alone, f'inferencer image {b}')


def test_mmdet_inference_apis_predict_each_image_as_alone():
    """mmdet's ``DetInferencer`` with ``batch_size=8`` and ``init_detector`` + ``inference_detector`` on images of
    three sizes, on a config's RetinaNet (random weights, score threshold 0): each image's detections are those it
    gets alone."""
    pytest.importorskip('mmdet')
    import warnings

    from mmdet.apis import DetInferencer, inference_detector, init_detector
    images = _arrays()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')   # no checkpoint: random weights, COCO's names
        torch.manual_seed(0)
        inferencer = DetInferencer(_config('retinanet_pcpvt-tiny_fpn_shapes.py'), device='cpu')
        model = init_detector(_config('retinanet_pcpvt-tiny_fpn_shapes.py'), device='cpu')
    for m in (inferencer.model, model):
        m.bbox_head.test_cfg.score_thr = 0.
    batched = inferencer(images, batch_size=8, return_datasamples=True)['predictions']
    for b, image in enumerate(images):
        (alone,) = inferencer(image, batch_size=1, return_datasamples=True)['predictions']
        _assert_same_predictions('mmdet', batched[b], alone, f'inferencer image {b}')
    batched = inference_detector(model, images)
    for b, image in enumerate(images):
        _assert_same_predictions('mmdet', batched[b], inference_detector(model, image), f'image {b}')


def test_predict_alone_runs_each_image_through_an_attached_engine():
    """A model whose backbone, neck and head run on an engine together (``deploy.openmmlab.attach_engine``) has
    no backbone to batch: each image runs cropped, the predictions as alone."""
    from cpvt_backbones.adapters.alone import batched_backbone, predict_alone
    from cpvt_backbones.deploy.openmmlab import TensorForward, attach_engine
    model = shapes_model('fpn_pcpvt-tiny_shapes.py')
    reference = _predictions(model, _raw_batch('mmseg', DENSE_SIZES[:1]))
    attach_engine(model, TensorForward(model))
    predict_alone(predict_alone(model))   # twice: the same
    assert batched_backbone(model) is None
    assert vars(model)['predict_batch'].__func__ is not vars(model)['predict'].__func__
    batch = _raw_batch('mmseg', DENSE_SIZES)
    batched = _predictions(model, batch)
    _assert_same_predictions('mmseg', batched[0], reference[0], 'image 0')
    for b in range(1, len(DENSE_SIZES)):
        (alone,) = _predictions(model, {k: v[b:b + 1] for k, v in batch.items()})
        _assert_same_predictions('mmseg', batched[b], alone, f'image {b}')


def test_predict_alone_hook_refuses_a_preprocessor_without_valid_sizes():
    from types import SimpleNamespace
    model = shapes_model('retinanet_pcpvt-tiny_fpn_shapes.py')   # skips without mmdet and mmseg

    from mmdet.models.data_preprocessors import DetDataPreprocessor

    from cpvt_backbones.adapters.hooks import PredictAloneHook
    model.data_preprocessor = DetDataPreprocessor()
    with pytest.raises(ValueError, match="DetDataPreprocessor does not hand.*'ValidSizeDetDataPreprocessor'"):
        PredictAloneHook().before_val(SimpleNamespace(model=model))


RUN_SIZES = [(1, 1), (97, 131), (61, 75), (224, 160), (97, 131), (33, 240), (61, 75)]


@pytest.mark.parametrize('features_only', [True, False], ids=['features-fused', 'classifier'])
def test_run_images_gives_each_image_its_output_alone(features_only):
    """``run_images`` batches images of seven sizes (two repeated, a 1 x 1 one) three at a time, padded with the
    valid sizes, on the fused engine (features) and the plain model (classifier): each output equals the image's
    output alone, in the images' order."""
    from cpvt_backbones import prepare, run_images
    torch.manual_seed(0)
    model = PyramidCPVT(**PYRAMID, num_classes=0 if features_only else 5, features_only=features_only).eval()
    images = _images(RUN_SIZES)
    for module in ((prepare(model, 'fused'),) if features_only else (model,)):
        outputs = run_images(module, images, batch_size=3)
        with torch.no_grad():
            for i, image in enumerate(images):
                alone = module(image[None])
                if features_only:
                    assert all(_rel(o[None], a) < 1e-5 for o, a in zip(outputs[i], alone, strict=True)), i
                else:
                    assert _rel(outputs[i][None], alone) < 1e-5, i


def test_run_images_batches_one_size_for_a_module_without_valid_sizes():
    """A module that takes no ``valid_sizes`` (an engine's) gets batches of images of one size, never padding."""
    from cpvt_backbones import run_images

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shapes = []
            self.model = CPVT(**COLUMNAR, num_classes=3).eval()

        def forward(self, x):
            self.shapes.append(tuple(x.shape))
            return self.model(x)

    torch.manual_seed(0)
    module = Plain().eval()
    images = _images(RUN_SIZES)
    outputs = run_images(module, images, batch_size=4)
    assert sorted(module.shapes) == sorted([(1, 3, 1, 1), (2, 3, 97, 131), (2, 3, 61, 75), (1, 3, 224, 160),
                                            (1, 3, 33, 240)])
    with torch.no_grad():
        for out, image in zip(outputs, images, strict=True):
            assert _rel(out[None], module.model(image[None])) < 1e-5


def test_run_images_reports_progress_and_refuses_bad_input(monkeypatch):
    from cpvt_backbones import run_images
    from cpvt_backbones.deploy import batched
    monkeypatch.setattr(batched, 'PROGRESS_EVERY', 0.)
    model = PyramidCPVT(**PYRAMID, num_classes=5).eval()
    lines = []
    run_images(model, _images(RUN_SIZES[:4]), batch_size=2, progress=lines.append)
    assert lines[-1].startswith('4/4 images, ') and lines[0].startswith('2/4 images, ') and 's left' in lines[0]
    with pytest.raises(ValueError, match=r'images\[1\] must be a \(C, h, w\) tensor with pixels, got \(3, 0, 5\)'):
        run_images(model, [torch.zeros(3, 4, 4), torch.zeros(3, 0, 5)])
    with pytest.raises(ValueError, match='batch_size must be at least 1'):
        run_images(model, _images(RUN_SIZES[:2]), batch_size=0)
    with pytest.raises(ValueError, match='evaluation mode'):
        run_images(model.train(), _images(RUN_SIZES[:2]))


def test_run_images_refuses_an_image_unlike_the_others_by_index():
    """Channels other than the model's or the other images', an integer image, a dtype other than the others':
    refused naming the image and what differs, wherever the image is in its batch (first or not), before the
    model runs; nothing is converted by its neighbour's channels or dtype."""
    from cpvt_backbones import run_images
    model = PyramidCPVT(**PYRAMID, num_classes=5).eval()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    good = _images([(20, 24), (20, 24), (20, 24)])
    cases = [(torch.rand(1, 20, 24), r'images\[{i}\] has 1 channel, the model takes 3 \(in_chans\)'),
             ((torch.rand(3, 20, 24) * 255).to(torch.uint8), r'images\[{i}\] is torch.uint8: .*floating-point.*'
                                                             'convert and normalise it first'),
             (torch.rand(3, 20, 24, dtype=torch.float64),
              r'images\[{i}\] is torch.float64, images\[0\] is torch.float32: every image must have the same dtype')]
    for odd, message in cases:
        for i in (1, 2):
            images = good[:i] + [odd] + good[i:]
            with pytest.raises(ValueError, match=message.format(i=i)):
                run_images(model, images, batch_size=4)
    with pytest.raises(ValueError, match=r'images\[0\] has 1 channel, the model takes 3'):
        run_images(model, [torch.rand(1, 20, 24)] + good, batch_size=4)
    with pytest.raises(ValueError, match=r'images\[1\] is torch.float32, images\[0\] is torch.float64'):
        run_images(model, [torch.rand(3, 20, 24, dtype=torch.float64)] + good, batch_size=4)
    plain = torch.nn.Conv2d(4, 2, 3).eval()   # no in_chans: the first image's channels hold for the others
    with pytest.raises(ValueError, match=r'images\[1\] has 3 channels, images\[0\] has 4: every image must have '
                                         'the same channels'):
        run_images(plain, [torch.rand(4, 8, 8), torch.rand(3, 8, 8)])
    assert calls == []


def test_run_images_returns_outputs_that_hold_no_batch():
    """Each returned output (a classifier's row, a feature model's cropped maps) is in storage of its own size:
    none keeps its padded batch alive."""
    from cpvt_backbones import run_images
    images = _images(RUN_SIZES)
    for features_only in (True, False):
        model = PyramidCPVT(**PYRAMID, num_classes=0 if features_only else 5, features_only=features_only).eval()
        for out in run_images(model, images, batch_size=3):
            for t in (out if features_only else [out]):
                assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), (tuple(t.shape), features_only)
