"""PVTv2 on the pyramid trunk: timm's parameter counts and outputs on timm's weights at any size, the official and
mmdet layouts, padded batches as alone, and the family's errors."""
import re

import pytest
import torch
from test_padded_batches import SIZES, _assert_as_alone, _images

from cpvt_backbones.convert import detect_layout, from_native, to_native
from cpvt_backbones.layers.position import ENCODINGS
from cpvt_backbones.models import PVTv2, create_model
from cpvt_backbones.models.pvt_v2 import SIZES as NAMED

# timm's counts (``sum(p.numel() for p in timm.create_model(name).parameters())``).
COUNTS = {'pvt_v2_b0': 3_666_760, 'pvt_v2_b1': 14_009_000, 'pvt_v2_b2': 25_362_856, 'pvt_v2_b2_li': 22_553_512,
          'pvt_v2_b3': 45_238_696, 'pvt_v2_b4': 62_556_072, 'pvt_v2_b5': 81_956_008}
SMALL = dict(embed_dims=(16, 32, 48, 64), num_heads=(1, 2, 3, 4), depths=(2, 2, 2, 2), mlp_ratios=(2, 2, 2, 2))


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize('name', sorted(COUNTS))
def test_parameter_counts_equal_timms(name):
    with torch.device('meta'):
        model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == COUNTS[name]
    assert set(NAMED) == set(COUNTS)


@pytest.fixture(scope='module', params=['pvt_v2_b0', 'pvt_v2_b2_li'])
def pair(request):
    """timm's model (random weights, seed 0) and ours with them loaded through the converters."""
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    reference = timm.create_model(request.param).eval()
    ours = create_model(request.param).eval()
    state = reference.state_dict()
    assert detect_layout(state) == 'pvt_v2_timm'
    ours.load_state_dict(to_native(state))
    return request.param, reference, ours


@pytest.mark.parametrize('hw', [(224, 224), (97, 131), (33, 40), (1, 1)])
def test_outputs_equal_timms_on_its_weights(pair, hw):
    name, reference, ours = pair
    x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = ours(x)
        try:
            ref = reference(x)
        except RuntimeError:   # timm's strided reduction needs a map of sr_ratio tokens or more
            assert hw == (1, 1) and name == 'pvt_v2_b0'
            assert out.shape == (2, 1000) and torch.isfinite(out).all()
            return
        assert _rel(out, ref) < 1e-5
        if not hasattr(reference, 'forward_intermediates'):   # timm < 1.0
            return
        maps = ours.forward_intermediates(x, intermediates_only=True)
        ref_maps = reference.forward_intermediates(x, intermediates_only=True)
        for m, r in zip(maps, ref_maps, strict=True):
            assert m.shape == r.shape and _rel(m, r) < 1e-5


def test_timm_layout_round_trips(pair):
    _, reference, ours = pair
    state = reference.state_dict()
    back = from_native(ours.state_dict(), 'pvt_v2_timm')
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)


def _official(native):
    """Native keys as the official PVTv2 release names them (stages from 1, ``mlp.dwconv.dwconv``)."""
    out = {}
    for k, v in native.items():
        k = re.sub(r'^patch_embeds\.(\d)', lambda m: f'patch_embed{int(m.group(1)) + 1}', k)
        k = re.sub(r'^blocks\.(\d)', lambda m: f'block{int(m.group(1)) + 1}', k)
        k = re.sub(r'^norms\.(\d)', lambda m: f'norm{int(m.group(1)) + 1}', k)
        out[k.replace('mlp.dwconv.', 'mlp.dwconv.dwconv.')] = v
    return out


def test_official_layout_loads(pair):
    _, _, ours = pair
    native = ours.state_dict()
    official = _official(native)
    assert 'block1.0.mlp.dwconv.dwconv.weight' in official and 'norm4.weight' in official
    assert detect_layout(official) == 'pvt_v2_official'
    converted = to_native(official)
    assert converted.keys() == native.keys() and all(torch.equal(converted[k], native[k]) for k in native)


def test_mmdet_layout_loads_and_gives_mmdets_features():
    """Our weights written in mmdet's layout load strictly into mmdet's own ``PyramidVisionTransformerV2`` and
    give our features; its state dict reads back to ours."""
    backbones = pytest.importorskip('mmdet.models.backbones')
    torch.manual_seed(0)
    ours = create_model('pvt_v2_b0', features_only=True).eval()
    theirs = backbones.PyramidVisionTransformerV2(embed_dims=32, num_layers=[2, 2, 2, 2], num_heads=[1, 2, 5, 8],
                                                  mlp_ratios=[8, 8, 4, 4]).eval()
    theirs.load_state_dict(from_native(ours.state_dict(), 'pvt_v2_mmdet'), strict=True)
    assert detect_layout(theirs.state_dict()) == 'pvt_v2_mmdet'
    back = to_native(theirs.state_dict())
    assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())
    x = torch.randn(1, 3, 97, 131)
    with torch.no_grad():
        for m, r in zip(ours(x), theirs(x), strict=True):
            assert m.shape == r.shape and _rel(m, r) < 1e-5


@pytest.mark.parametrize('linear', [False, True], ids=['strided', 'li'])
@pytest.mark.parametrize('features_only', [True, False], ids=['features', 'classifier'])
def test_padded_batch_as_alone(linear, features_only):
    torch.manual_seed(0)
    kwargs = dict(features_only=True, num_classes=0) if features_only else dict(num_classes=10)
    model = PVTv2(**SMALL, linear=linear, **kwargs).eval()
    _assert_as_alone(model, _images(SIZES), SIZES)


@pytest.mark.parametrize('encoding', [n for n in ENCODINGS if n != 'rpe'])
def test_padded_batch_as_alone_with_every_encoding(encoding):
    torch.manual_seed(0)
    model = PVTv2(**SMALL, pos_encoding=encoding, features_only=True, num_classes=0).eval()
    _assert_as_alone(model, _images(SIZES), SIZES)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match='rpe.*biases global attention'):
        PVTv2(**SMALL, pos_encoding='rpe')
    with pytest.raises(ValueError, match='pooled keys'):
        PVTv2(**SMALL, linear=True, pos_encoding='rope_axial')
    with pytest.raises(ValueError, match='one entry per stage'):
        PVTv2(**dict(SMALL, depths=(2, 2, 2)))
    with pytest.raises(TypeError, match='no argument'):
        create_model('pvt_v2_b0', window_sizes=(7, 7, 7, 7))
    with pytest.raises(TypeError, match=r"no argument\(s\) \['window_mask'\]"):
        create_model('pvt_v2_b0', window_mask=True)


def test_openmmlab_backbones_build_it_and_load_mmdets_checkpoint(tmp_path):
    """``dict(type='PVTv2', arch=...)`` builds in mmdet's registry; a checkpoint of mmdet's own
    ``PyramidVisionTransformerV2`` loads into it through ``init_cfg`` and gives mmdet's features."""
    backbones = pytest.importorskip('mmdet.models.backbones')
    from mmdet.registry import MODELS

    import cpvt_backbones.adapters.mmdet  # noqa: F401  (registers the backbones)
    torch.manual_seed(0)
    theirs = backbones.PyramidVisionTransformerV2(embed_dims=32, num_layers=[2, 2, 2, 2], num_heads=[1, 2, 5, 8],
                                                  mlp_ratios=[8, 8, 4, 4]).eval()
    path = tmp_path / 'mmdet_pvt_v2_b0.pth'
    torch.save({'state_dict': theirs.state_dict()}, path)
    ours = MODELS.build(dict(type='PVTv2', arch='pvt_v2_b0', init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    ours.init_weights()
    ours.eval()
    x = torch.randn(2, 3, 61, 203)
    with torch.no_grad():
        for m, r in zip(ours(x), theirs(x), strict=True):
            assert m.shape == r.shape and _rel(m, r) < 1e-5


def test_a_pvt_v2_checkpoint_for_another_family_is_named():
    from cpvt_backbones.convert import CheckpointMismatchError, load_into
    with pytest.raises(CheckpointMismatchError, match=r"it is a PVTv2 checkpoint \(embed_dims \(32, 64, 160, 256\), "
                                                      r"depths \(2, 2, 2, 2\)\) and the model is a Twins-PCPVT: "
                                                      r"load it into 'pvt_v2_b0' \(PVTv2\)"):
        load_into(create_model('pcpvt_tiny'), create_model('pvt_v2_b0').state_dict())


def test_timm_features_and_transformers_backbone_build_it():
    """timm's ``features_only`` (under ``cpvt_backbones_pvt_v2_*``, beside timm's own) and the transformers
    backbone give the core model's maps, at an odd size."""
    timm = pytest.importorskip('timm')
    import cpvt_backbones.adapters.timm  # noqa: F401  (registers)
    torch.manual_seed(0)
    core = create_model('pvt_v2_b0', features_only=True).eval()
    features = timm.create_model('cpvt_backbones_pvt_v2_b0', features_only=True, out_indices=(1, 3)).eval()
    features.model.load_state_dict(core.state_dict(), strict=False)
    x = torch.randn(1, 3, 61, 90)
    with torch.no_grad():
        maps = core(x)
        assert [m.shape for m in features(x)] == [maps[1].shape, maps[3].shape]
        assert torch.allclose(features(x)[1], maps[3], atol=1e-5)
    assert features.feature_info.reduction() == [8, 32] and features.feature_info.channels() == [64, 256]
    pytest.importorskip('transformers')
    from cpvt_backbones.adapters.hf import CPVTBackbone, CPVTBackboneConfig
    backbone = CPVTBackbone(CPVTBackboneConfig(arch='pvt_v2_b0', out_features=['stage2', 'stage4'])).eval()
    backbone.model.load_state_dict(core.state_dict())
    with torch.no_grad():
        out = backbone(x).feature_maps
    assert [o.shape for o in out] == [maps[1].shape, maps[3].shape]
    assert torch.allclose(out[1], maps[3], atol=1e-5)


def test_smp_and_torchvision_take_it_at_odd_sizes():
    """SMP's Unet on the timm name and torchvision's FPN backbone build it and run at sizes no stride divides."""
    pytest.importorskip('timm')
    smp = pytest.importorskip('segmentation_models_pytorch')
    pytest.importorskip('torchvision')
    import cpvt_backbones.adapters.timm  # noqa: F401  (registers)
    from cpvt_backbones.adapters.smp import AnySize
    from cpvt_backbones.adapters.torchvision import cpvt_fpn_backbone
    unet = AnySize(smp.Unet('tu-cpvt_backbones_pvt_v2_b0', encoder_weights=None, classes=3)).eval()
    fpn = cpvt_fpn_backbone('pvt_v2_b0').eval()
    with torch.no_grad():
        assert unet(torch.randn(1, 3, 61, 90)).shape == (1, 3, 61, 90)
        maps = fpn(torch.randn(1, 3, 97, 131))
    assert {k: tuple(v.shape[-2:]) for k, v in maps.items()} == {'0': (25, 33), '1': (13, 17), '2': (7, 9),
                                                                  '3': (4, 5), 'pool': (2, 3)}


@pytest.mark.heavy
@pytest.mark.parametrize('engine, linear', [('openvino', False), ('onnxruntime', True)], ids=['openvino', 'onnx-li'])
def test_exported_engines_run_it_at_any_size(engine, linear):
    """The strided reduction that drops the remainder (and pads a map smaller than one cell) and the li model's
    pooled keys export as one graph for every size, 1 x 1 included; the fused engine refuses PVTv2 by name."""
    pytest.importorskip(engine)
    from cpvt_backbones import prepare
    torch.manual_seed(0)
    model = PVTv2(**SMALL, linear=linear, features_only=True, num_classes=0).eval()
    prepared = prepare(model, engine)
    for hw in [(97, 131), (1, 1), (33, 7)]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            for out, ref in zip(prepared(x), model(x), strict=True):
                assert out.shape == ref.shape and _rel(out, ref) < 1e-4, hw
    with pytest.raises(ValueError, match='is a ConvMlp, not a plain Mlp'):
        prepare(PVTv2(**SMALL).eval(), 'fused')


@pytest.mark.heavy
@pytest.mark.parametrize('linear', [False, True], ids=['drop', 'li'])
def test_openvino_bucketed_gets_each_image_as_alone(linear):
    """``prepare(..., 'openvino', bucket=32)`` (converted with each image's valid size as an input, compiled once
    per bucket): a padded batch of odd sizes and single images each get what the model gives at their own size,
    keys reduced by the strided convolution that drops the remainder or by pooling (li)."""
    pytest.importorskip('openvino')
    from cpvt_backbones import prepare
    from cpvt_backbones.deploy.batched import pad_images
    from cpvt_backbones.deploy.bucketed import Bucketed
    torch.manual_seed(0)
    model = PVTv2(**SMALL, linear=linear, features_only=True, num_classes=0).eval()
    bucketed = prepare(model, 'openvino', bucket=32)
    assert isinstance(bucketed, Bucketed)
    generator = torch.Generator().manual_seed(0)
    images = [torch.randn(3, *hw, generator=generator) for hw in ((1, 1), (7, 20), (33, 47))]
    x, sizes = pad_images(images)
    with torch.no_grad():
        batch = bucketed(x, valid_sizes=sizes)
        for i, image in enumerate(images):
            alone = model(image[None])
            for out, ref in zip(batch, alone, strict=True):
                h, w = ref.shape[-2:]
                assert _rel(out[i:i + 1, :, :h, :w], ref) < 1e-4, (image.shape, ref.shape)
            for out, ref in zip(bucketed(image[None]), alone, strict=True):
                assert out.shape == ref.shape and _rel(out, ref) < 1e-4, image.shape
    assert set(bucketed.buckets) == {(64, 64), (32, 32)}
