"""Shapes at odd sizes, gradients, counts, options and bad input for every model."""
import math

import pytest
import torch

from cpvt_backbones import create_model, list_models
from cpvt_backbones.models import MODEL_SPECS

ALL = list_models()
SMALL = ['pcpvt_tiny', 'pcpvt_small', 'cpvt_tiny', 'cpvt_tiny_gap', 'cpvt_small_gap']
BIG = [n for n in ALL if n not in SMALL]
ODD_SIZES = [(1, 1), (7, 500), (33, 33), (97, 131)]


def _expected(h, w):
    return [(math.ceil(h / s), math.ceil(w / s)) for s in (4, 8, 16, 32)]


def test_names():
    assert set(ALL) >= {'cpvt_tiny', 'cpvt_small', 'cpvt_base', 'cpvt_tiny_gap', 'cpvt_small_gap',
                        'cpvt_base_gap', 'pcpvt_tiny', 'pcpvt_small', 'pcpvt_base', 'pcpvt_large'}
    assert not MODEL_SPECS['pcpvt_tiny'].paper and 'not a paper model' in MODEL_SPECS['pcpvt_tiny'].note


@pytest.mark.parametrize('name, expected', [('pcpvt_small', 24_106_216), ('pcpvt_base', 43_828_456),
                                            ('pcpvt_large', 60_989_672)])
def test_pcpvt_parameter_counts(name, expected):
    assert sum(p.numel() for p in create_model(name).parameters()) == expected


@pytest.mark.parametrize('name, paper', [('cpvt_tiny', 5.7e6), ('cpvt_small', 22e6), ('cpvt_base', 86e6),
                                         ('cpvt_tiny_gap', 5.7e6), ('cpvt_small_gap', 22e6),
                                         ('cpvt_base_gap', 86e6)])
def test_cpvt_parameter_counts(name, paper):
    model = create_model(name)
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - paper) / paper < 0.02
    assert (model.cls_token is None) == name.endswith('_gap')
    dim = model.embed_dim
    assert sum(p.numel() for p in model.pos_block.parameters()) == 6 * (dim * 9 + dim)


def _check_features(name, sizes):
    model = create_model(name, features_only=True).eval()
    for h, w in sizes:
        with torch.no_grad():
            outs = model(torch.randn(2, 3, h, w))
        assert [tuple(o.shape[2:]) for o in outs] == _expected(h, w), (name, h, w)
        assert [o.shape[1] for o in outs] == list(model.out_channels)
        assert all(o.shape[0] == 2 and torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('name', SMALL)
def test_features_any_size(name):
    _check_features(name, ODD_SIZES + [(513, 769)])


@pytest.mark.heavy
@pytest.mark.parametrize('name', BIG)
def test_features_any_size_big(name):
    """The odd sizes on the larger variants (the 513 x 769 input, the same code at other widths, runs on the
    small ones above: on a base or large model it costs seconds per size)."""
    _check_features(name, ODD_SIZES)


@pytest.mark.parametrize('name', ALL)
def test_classifier_any_size(name):
    model = create_model(name, num_classes=7).eval()
    for h, w in [(1, 1), (33, 65)]:
        with torch.no_grad():
            assert model(torch.randn(2, 3, h, w)).shape == (2, 7)


def _assert_all_grads(model, x):
    out = model(x)
    loss = sum(o.float().pow(2).mean() for o in (out if isinstance(out, tuple) else (out,)))
    loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not no_grad


@pytest.mark.parametrize('name', SMALL)
@pytest.mark.parametrize('features_only', [False, True])
def test_gradients_reach_every_parameter(name, features_only):
    """Under drop-path too: a batch of 8 at rate 0.1 leaves every block some sample, whatever the random stream
    (all 8 dropped in one block: 1e-8)."""
    _assert_all_grads(create_model(name, features_only=features_only, drop_path_rate=0.1).train(),
                      torch.randn(8, 3, 70, 45))


@pytest.mark.heavy
@pytest.mark.parametrize('name', BIG)
def test_gradients_reach_every_parameter_big(name):
    _assert_all_grads(create_model(name, features_only=True).train(), torch.randn(1, 3, 64, 64))


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_out_indices_build_only_what_they_use(name):
    model = create_model(name, features_only=True, out_indices=(1, 2))
    outs = model(torch.randn(1, 3, 64, 96))
    assert [tuple(o.shape[2:]) for o in outs] == _expected(64, 96)[1:3]
    _assert_all_grads(model, torch.randn(1, 3, 64, 96))


def test_peg_settings_are_honoured():
    model = create_model('pcpvt_tiny', pos_encoding=dict(type='peg', kernel_size=5, peg_type='separable',
                                                         positions=((0, 1), (), (1,), (0,))))
    assert len(model.pos_block) == 4
    assert model.pos_block[0].proj[0].kernel_size == (5, 5) and len(model.pos_block[0].proj) == 2
    assert model.pos_block.peg_after == {(0, 0): 0, (0, 1): 1, (2, 1): 2, (3, 0): 3}
    col = create_model('cpvt_tiny', pos_encoding=dict(type='peg', positions=(0,), kernel_size=7))
    assert len(col.pos_block) == 1 and col.pos_block[0].proj[0].padding == (3, 3)
    assert len(create_model('cpvt_tiny').pos_block) == 6  # the paper's best: after blocks 0-5


@pytest.mark.parametrize('name,positions', [('pcpvt_tiny', ((0, 1), (), (1,), (0,))), ('cpvt_tiny', (0, 3, 11))])
def test_peg_after_is_the_order_the_network_runs(name, positions):
    """In both models ``peg_after[(stage, j)] = k`` means PEG k runs right after block j of that stage."""
    model = create_model(name, pos_encoding=dict(type='peg', positions=positions))
    stages = model.blocks if name.startswith('pcpvt') else [model.blocks]
    order = []
    for i, stage in enumerate(stages):
        for j, blk in enumerate(stage):
            blk.register_forward_hook(lambda *_, key=(i, j): order.append(key))
    for k, peg in enumerate(model.pos_block):
        peg.register_forward_hook(lambda *_, k=k: order.append(k))
    model(torch.randn(1, 3, 64, 64))
    follows = {order[n - 1]: k for n, k in enumerate(order) if isinstance(k, int)}
    assert follows == model.pos_block.peg_after and len(follows) == len(model.pos_block)


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_strides_and_channels_describe_the_returned_maps(name):
    for out_indices in ((0, 1, 2, 3), (1, 3), 3):
        model = create_model(name, features_only=True, out_indices=out_indices)
        outs = model(torch.randn(1, 3, 70, 45))
        assert model.out_indices == ((out_indices,) if isinstance(out_indices, int) else out_indices)
        assert len(model.strides) == len(model.out_channels) == len(outs)
        assert [tuple(o.shape[1:]) for o in outs] == [(c, -(-70 // s), -(-45 // s))
                                                      for c, s in zip(model.out_channels, model.strides, strict=False)]
    classifier = create_model(name)
    assert classifier.out_indices == classifier.strides == classifier.out_channels == ()


def test_peg_changes_the_output():
    x = torch.randn(1, 3, 64, 64)
    torch.manual_seed(1)
    a = create_model('pcpvt_tiny').eval()
    torch.manual_seed(1)
    b = create_model('pcpvt_tiny', pos_encoding='none').eval()
    b.load_state_dict({k: v for k, v in a.state_dict().items() if not k.startswith('pos_block')})
    with torch.no_grad():
        assert not torch.allclose(a(x), b(x))


def test_frozen_stages():
    model = create_model('pcpvt_tiny', features_only=True, frozen_stages=2, drop_path_rate=0.5).train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in model.named_parameters()
                      if n.startswith(('patch_embeds.0.', 'patch_embeds.1.', 'blocks.0.', 'blocks.1.',
                                       'pos_block.0.', 'pos_block.1.'))}
    assert not model.blocks[1].training and model.blocks[2].training
    col = create_model('cpvt_tiny', frozen_stages=0)
    assert {n for n, p in col.named_parameters() if not p.requires_grad} == {
        'cls_token', 'patch_embed.proj.weight', 'patch_embed.proj.bias'}


def test_drop_path_rate_is_honoured():
    model = create_model('pcpvt_small', drop_path_rate=0.3)
    rates = [blk.drop_path.drop_prob for stage in model.blocks for blk in stage]
    assert rates[0] == 0 and rates[-1] == pytest.approx(0.3) and rates == sorted(rates)
    model.train()
    x = torch.randn(4, 3, 64, 64)
    assert not torch.allclose(model(x), model(x))  # stochastic while training
    model.eval()
    assert torch.equal(model(x), model(x))


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny_gap'])
def test_activation_checkpointing_gives_same_gradients(name):
    x = torch.randn(2, 3, 64, 64)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = create_model(name, features_only=True, grad_checkpointing=ckpt).train()
        sum(o.sum() for o in model(x)).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-5)


def test_attention_uses_sdpa(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', spy)
    create_model('pcpvt_tiny')(torch.randn(1, 3, 32, 32))
    assert len(calls) == 8


def test_no_weight_decay_names():
    model = create_model('cpvt_tiny')
    names = model.no_weight_decay()
    assert 'cls_token' in names and 'pos_block.0.proj.0.weight' in names and len(names) == 1 + 6 * 2


@pytest.mark.parametrize('x, error, match', [
    ([1, 2, 3], TypeError, 'torch.Tensor'),
    (torch.randn(3, 32, 32), ValueError, '4-D NCHW'),
    (torch.randn(1, 1, 3, 32, 32), ValueError, '4-D NCHW'),
    (torch.randn(1, 4, 32, 32), ValueError, '3 input channels'),
    (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), TypeError, 'floating-point'),
    (torch.zeros(1, 3, 32, 32, dtype=torch.bool), TypeError, 'floating-point'),
    (torch.randn(0, 3, 32, 32), ValueError, 'non-empty'),
    (torch.randn(1, 3, 0, 32), ValueError, 'non-empty'),
    (torch.randn(1, 3, 32, 32, dtype=torch.float64), TypeError, r"input is torch.float64 but the model's weights are "
                                                                r'torch.float32: convert one'),
    (torch.randn(1, 3, 32, 32, dtype=torch.float16), TypeError, 'input is torch.float16'),
])
@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
@pytest.mark.parametrize('features_only', [False, True])
def test_bad_input(name, features_only, x, error, match):
    with pytest.raises(error, match=match):
        create_model(name, features_only=features_only)(x)


def test_other_float_dtypes_run_once_the_model_matches_or_under_autocast():
    model = create_model('pcpvt_tiny', features_only=True).eval()
    x = torch.randn(1, 3, 32, 48)
    ref = model(x)
    got = model.double()(x.double())
    assert all(torch.allclose(a.float(), b, atol=1e-4) for a, b in zip(got, ref, strict=False))
    model.float()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert [o.shape for o in model(x.bfloat16())] == [o.shape for o in ref]


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(pos_encoding=dict(type='peg', kernel_size=4)), ValueError, 'odd'),
    (dict(pos_encoding=dict(type='peg', peg_type='dense')), ValueError, 'peg_type'),
    (dict(pos_encoding=dict(type='peg', positions=((0,), (0,), (9,), (0,)))), ValueError, r'positions\[2\]'),
    (dict(pos_encoding=dict(type='peg', positions=(0, 0, 0, 0))), TypeError, 'one sequence of block indices'),
    (dict(depths=(2, 2, 2)), ValueError, 'one entry per stage'),
    (dict(features_only=True, out_indices=(0, 4)), ValueError, 'out_indices'),
    (dict(out_indices=(0, 1)), ValueError, 'features_only'),
    (dict(features_only=True, num_classes=10), ValueError, 'num_classes=0'),
    (dict(frozen_stages=5), ValueError, 'frozen_stages'),
    (dict(features_only=True, out_indices=1.5), ValueError, 'out_indices must be an int or a non-empty sequence'),
    (dict(features_only=True, out_indices='0'), ValueError, 'out_indices must be a non-empty sequence of ints'),
    (dict(drop_path_rate=1.0), ValueError, r'drop_path_rate must be in \[0, 1\)'),
    (dict(drop_path_rate=-0.1), ValueError, 'drop_path_rate must be in'),
    (dict(drop_rate=1.5), ValueError, 'drop_rate must be in'),
    (dict(attn_drop_rate=1.0), ValueError, 'attn_drop_rate must be in'),
    (dict(bogus=1), TypeError, r"no argument\(s\) \['bogus'\]"),
])
def test_bad_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        create_model('pcpvt_tiny', **kwargs)


def test_bad_columnar_settings():
    with pytest.raises(ValueError, match='within -1..11'):
        create_model('cpvt_tiny', pos_encoding=dict(type='peg', positions=(0, 12)))
    with pytest.raises(ValueError, match='within -1..12'):
        create_model('cpvt_tiny', frozen_stages=13)
    with pytest.raises(ValueError, match="unknown model 'cpvt_huge'; valid names"):
        create_model('cpvt_huge')


def test_scenes_are_drawn_natively_at_any_scale(tmp_path):
    """A held-out scene drawn at 2x has the same shapes at twice the size (label maps agree once the larger one
    is subsampled), and a drawn split holds the same scenes at the asked long side; stale data is replaced."""
    import json

    import numpy as np

    from cpvt_backbones.datasets import ShapesSpec, generate_drawn_split, generate_shapes, render, shape_scenes
    spec = ShapesSpec(num_train=2, num_val=3, seed=5)
    scene = shape_scenes(spec)['val'][0]
    (_, labels, boxes), (image2, labels2, boxes2) = render(scene, 1.), render(scene, 2.)
    assert image2.shape == (2 * scene.height, 2 * scene.width, 3) and len(boxes) == len(boxes2) > 0
    for (c1, b1, a1, _), (c2, b2, a2, _) in zip(boxes, boxes2, strict=False):
        assert c1 == c2 and np.allclose(np.array(b2), 2 * np.array(b1), atol=2.5) and abs(a2 / a1 - 4) < 0.3
    assert (labels2[::2, ::2] == labels).mean() > 0.98  # the same shapes: only edge pixels may differ
    generate_shapes(tmp_path / 'shapes', spec)
    root = generate_drawn_split(tmp_path / 'drawn', spec, 300)
    drawn, val = (json.loads((r / 'annotations' / 'val.json').read_text()) for r in (root, tmp_path / 'shapes'))
    assert [max(i['height'], i['width']) for i in drawn['images']] == [300] * 3
    classes = [sorted(a['category_id'] for a in coco['annotations']) for coco in (drawn, val)]
    assert classes[0] == classes[1]
    (root / 'spec.json').write_text('{"another": "dataset"}')
    generate_drawn_split(root, spec, 300)
    assert json.loads((root / 'spec.json').read_text())['long_side'] == 300
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith('.')] == []  # no temporary folder left


def test_shape_masks_are_coco_rle_of_each_shapes_pixels(tmp_path):
    """The instance masks written for mmdet decode (pycocotools, as mmdet's LoadAnnotations and CocoMetric do) to
    exactly the pixels the label map gives the shape, with the annotation's area; the encoder also holds at the
    edge cases (a mask starting with a 1, an empty and a full mask)."""
    import json

    import numpy as np
    from PIL import Image
    mask_utils = pytest.importorskip('pycocotools.mask')

    from cpvt_backbones.datasets import ShapesSpec, generate_shapes
    from cpvt_backbones.datasets.shapes import rle
    for mask in (np.eye(5, 7, dtype=bool), np.zeros((3, 4), bool), np.ones((4, 3), bool), np.array([[1, 0, 1]], bool)):
        encoded = rle(mask)
        assert np.array_equal(mask_utils.decode(mask_utils.frPyObjects(encoded, *encoded['size'])), mask)
    root = tmp_path / 'shapes'
    generate_shapes(root, ShapesSpec(num_train=1, num_val=4, seed=3))
    coco = json.loads((root / 'annotations' / 'val.json').read_text())
    assert coco['annotations']
    for image in coco['images']:
        labels = np.asarray(Image.open(root / 'val' / 'masks' / image['file_name'].replace('.jpg', '.png')))
        anns = [a for a in coco['annotations'] if a['image_id'] == image['id']]
        union = np.zeros_like(labels, dtype=bool)
        for ann in anns:
            seg = ann['segmentation']
            mask = mask_utils.decode(mask_utils.frPyObjects(seg, *seg['size'])).astype(bool)
            assert seg['size'] == [image['height'], image['width']] and mask.sum() == ann['area']
            assert (labels[mask] == ann['category_id']).all()
            union |= mask
        assert np.array_equal(union, labels > 0)


def test_shape_datasets_are_deterministic(tmp_path):
    import json

    from cpvt_backbones.datasets import CLASSES, ShapesSpec, generate_shape_crops, generate_shapes
    spec = ShapesSpec(num_train=5, num_val=2, seed=4)
    for run in ('a', 'b'):
        generate_shapes(tmp_path / run, spec)
    a, b = (json.loads((tmp_path / r / 'annotations' / 'train.json').read_text()) for r in ('a', 'b'))
    assert a == b and len(a['images']) == 5 and a['annotations']
    assert {c['name'] for c in a['categories']} == set(CLASSES)
    for image in a['images']:
        assert 128 <= image['height'] <= 288 and 128 <= image['width'] <= 288
    assert (tmp_path / 'a' / 'train' / 'masks' / '00000.png').read_bytes() == \
        (tmp_path / 'b' / 'train' / 'masks' / '00000.png').read_bytes()
    generate_shape_crops(tmp_path / 'crops', num_train=8, num_val=4, size=32)
    assert sorted(p.name for p in (tmp_path / 'crops' / 'train').iterdir()) == sorted(CLASSES)


def test_every_constructor_reads_as_a_stage_spec():
    """No family's constructor (nor the shared ones it passes on to) is longer than 60 lines, docstring included:
    a family writes its stages and hands them on; the build order lives once, in ``CPVTBase.__init__``."""
    import inspect

    from cpvt_backbones.models import Pyramid
    from cpvt_backbones.models.base import CPVTBase
    classes = {spec.cls for spec in MODEL_SPECS.values()} | {Pyramid, CPVTBase}
    lengths = {cls.__name__: len(inspect.getsourcelines(cls.__init__)[0]) for cls in classes}
    assert max(lengths.values()) <= 60, lengths
