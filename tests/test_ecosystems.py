"""timm's pretrained tags and feature API, torch.fx tracing, SMP decoders at any size, torchvision's detectors,
and the size bound of a torch.export-ed program (docs/ecosystems.md)."""
import os

import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.layers.position import ENCODINGS

os.environ.setdefault('HF_HUB_OFFLINE', '1')
SIZES = ((97, 131), (224, 224))


def _depth_two(name):
    """The columnar models with two blocks (fast), PEG after block 0."""
    return dict(depth=2, pos_encoding=dict(type='peg', positions=(0,))) if name.startswith('cpvt') else {}


# ---------------------------------------------------------------------------------------------------- torch.fx

@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny', 'cpvt_tiny_gap'])
@pytest.mark.parametrize('features_only', [False, True])
def test_fx_symbolic_trace_equals_eager(name, features_only):
    torch.manual_seed(0)
    model = create_model(name, features_only=features_only, **_depth_two(name)).eval()
    graph = torch.fx.symbolic_trace(model)
    for hw in SIZES:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            want, got = model(x), graph(x)
        want, got = (want, got) if features_only else ((want,), (got,))
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=False)), hw


@pytest.mark.parametrize('encoding', sorted(set(ENCODINGS) - {'peg'}))
def test_fx_traces_every_position_encoding(encoding):
    """Encodings whose eager path branches on sizes (a table resized to another grid, RoPE's class token) take
    one branch-free path while fx traces: same values. Those that build their grid from the input's size need a
    torch whose fx traces sized factory calls (``compat.FEATURES['fx_sizes']``)."""
    from cpvt_backbones.compat import supports
    if encoding in ('sincos', 'rpe', 'rope_axial', 'rope_mixed') and not supports('fx_sizes'):
        pytest.skip(f"fx tracing {encoding} needs torch's fx to trace sized factory calls (fx_sizes)")
    torch.manual_seed(0)
    for name in ('pcpvt_tiny', 'cpvt_tiny'):
        kwargs = dict(depth=2) if name == 'cpvt_tiny' else {}
        model = create_model(name, pos_encoding=encoding, **kwargs).eval()
        graph = torch.fx.symbolic_trace(model)
        for hw in SIZES:
            x = torch.randn(1, 3, *hw)
            with torch.no_grad():
                assert torch.equal(graph(x), model(x)), (name, hw)


def test_torchvision_create_feature_extractor():
    fx = pytest.importorskip('torchvision.models.feature_extraction')
    torch.manual_seed(0)
    model = create_model('pcpvt_tiny').eval()
    extractor = fx.create_feature_extractor(model, return_nodes={'norm': 'tokens', 'head': 'logits'})
    for hw in SIZES:
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            out = extractor(x)
            assert torch.equal(out['tokens'], model.forward_features(x)) and torch.equal(out['logits'], model(x))


# ---------------------------------------------------------------------------------------------------- timm

timm = pytest.importorskip('timm')
import cpvt_backbones.adapters.timm  # noqa: E402,F401  (registers)


def test_timm_pretrained_tags_name_the_published_files():
    listed = timm.list_models(pretrained=True)
    published = ('pcpvt_small', 'pcpvt_base', 'pcpvt_large')
    assert {f'{n}.in1k' for n in published} <= set(listed)
    assert not any(n.startswith(('cpvt_tiny', 'cpvt_small', 'cpvt_base', 'pcpvt_tiny')) for n in listed)
    for name in published:
        assert timm.is_model_pretrained(name)
        cfg = timm.models.get_pretrained_cfg(f'{name}.in1k')
        assert cfg.tag == 'in1k' and cfg.architecture == name and cfg.fixed_input_size is False
        assert cfg.hf_hub_id == f'timm/twins_{name}.in1k' and cfg.hf_hub_filename == 'model.safetensors'
        assert cfg.url.endswith('.pth') and f'twins_{name}-' in cfg.url
    assert not timm.is_model_pretrained('pcpvt_tiny') and not timm.is_model_pretrained('cpvt_small')


def test_timm_tagged_name_builds_and_pretrained_goes_through_the_checked_cache(tmp_path, monkeypatch):
    from cpvt_backbones.convert import WeightsUnavailableError, hub
    model = timm.create_model('pcpvt_small.in1k', depths=(1, 1, 1, 1))
    assert model.pretrained_cfg['tag'] == 'in1k' and model.pretrained_cfg['hf_hub_id'] == 'timm/twins_pcpvt_small.in1k'
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(tmp_path))

    def offline(source, path):
        raise OSError('network is unreachable')
    monkeypatch.setattr(hub, '_fetch', offline)
    with pytest.raises(WeightsUnavailableError) as info:
        timm.create_model('pcpvt_small.in1k', pretrained=True)
    message = str(info.value)
    assert 'timm/twins_pcpvt_small.in1k/resolve/main/model.safetensors' in message
    assert 'twins_pcpvt_small-e70e7e7a.pth' in message and str(tmp_path) in message and 'pretrained=PATH' in message


@pytest.mark.parametrize('name', ['cpvt_tiny', 'cpvt_tiny_gap'])
def test_timm_features_only_gives_the_columnar_simple_pyramid(tmp_path, name):
    torch.manual_seed(1)
    kwargs = _depth_two(name)
    classifier = create_model(name, **kwargs).eval()
    path = tmp_path / 'w.pth'
    torch.save(classifier.state_dict(), path)
    feats = timm.create_model(name, features_only=True, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                              **kwargs).eval()
    assert feats.feature_info.reduction() == [4, 8, 16, 32] and feats.feature_info.channels() == [48, 96, 192, 192]
    trunk = classifier.state_dict()
    loaded = feats.model.state_dict()
    assert all(torch.equal(v, trunk[k]) for k, v in loaded.items() if not k.startswith('simple_fpn.'))
    assert set(loaded) - set(trunk) == {k for k in loaded if k.startswith('simple_fpn.')}  # new: no file holds them
    dense = create_model(name, features_only=True, **kwargs).eval()
    dense.load_state_dict(loaded)
    x = torch.randn(2, 3, 97, 131)
    with torch.no_grad():
        got = feats(x)
        assert [tuple(g.shape[-2:]) for g in got] == [(25, 33), (13, 17), (7, 9), (4, 5)]
        assert all(torch.equal(a, b) for a, b in zip(got, dense(x), strict=False))
    sub = timm.create_model(name, features_only=True, out_indices=(1, -1), **kwargs)
    assert sub.feature_info.reduction() == [8, 32] and len(sub(x)) == 2


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_timm_features_only_fx_equals_eager(name):
    torch.manual_seed(0)
    eager = timm.create_model(name, features_only=True, **_depth_two(name)).eval()
    torch.manual_seed(0)
    traced = timm.create_model(name, features_only=True, feature_cls='fx', **_depth_two(name)).eval()
    assert isinstance(traced.model, torch.fx.GraphModule)
    assert traced.feature_info.reduction() == eager.feature_info.reduction() == [4, 8, 16, 32]
    for hw in SIZES:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            assert all(torch.equal(a, b) for a, b in zip(traced(x), eager(x), strict=False)), hw
    with pytest.raises(ValueError, match="feature_cls must be one of"):
        timm.create_model(name, features_only=True, feature_cls='hook', **_depth_two(name))


# -------------------------------------------------------------------------------------- forward_intermediates

def test_forward_intermediates_takes_timm_vit_keywords():
    """As timm's ViT: a class-token model returns (map, prefix) pairs with return_prefix_tokens, a GAP or pyramid
    model plain maps; output_dict names them as timm does."""
    x = torch.randn(2, 3, 53, 75)
    torch.manual_seed(0)
    cls = create_model('cpvt_tiny', **_depth_two('cpvt_tiny')).eval()
    with torch.no_grad():
        plain = cls.forward_intermediates(x, indices=(0, 1), intermediates_only=True)
        pairs = cls.forward_intermediates(x, indices=(0, 1), return_prefix_tokens=True, intermediates_only=True)
        tokens = cls.forward_intermediates(x, indices=1, norm=True, stop_early=True, output_fmt='NLC',
                                           intermediates_only=True)
        out = cls.forward_intermediates(x, indices=(1,), return_prefix_tokens=True, output_dict=True)
        final = cls.forward_features(x)
    assert all(isinstance(p, tuple) and torch.equal(p[0], m) for p, m in zip(pairs, plain, strict=False))
    assert pairs[1][1].shape == (2, 1, 192) and plain[0].shape == (2, 192, 4, 5) and tokens[0].shape == (2, 20, 192)
    assert torch.equal(tokens[0], final[:, 1:]) and torch.equal(out['image_features'], final)
    assert torch.equal(out['image_intermediates'][0], plain[1])
    assert out['image_intermediates_prefix'][0].shape == (2, 1, 192)
    for name in ('cpvt_tiny_gap', 'pcpvt_tiny'):
        model = create_model(name, **_depth_two(name)).eval()
        with torch.no_grad():
            maps = model.forward_intermediates(x, indices=2, return_prefix_tokens=True, intermediates_only=True)
            out = model.forward_intermediates(x, return_prefix_tokens=True, output_dict=True, intermediates_only=True)
        assert all(isinstance(m, torch.Tensor) and m.ndim == 4 for m in maps)
        assert set(out) == {'image_intermediates'}


def test_smp_dpt_on_a_class_token_model():
    """SMP's DPT asks for prefix tokens (return_prefix_tokens=True). On a stride-16 encoder it checks for sizes
    divisible by 16 but its fusion blocks need 32: at 112 x 144 it fails inside the decoder, so AnySize needs
    multiple=32 given there."""
    smp = pytest.importorskip('segmentation_models_pytorch')
    from cpvt_backbones.adapters.smp import AnySize
    model = smp.DPT('tu-cpvt_tiny', encoder_weights=None, classes=2).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 96)).shape == (1, 2, 64, 96)
        assert model.encoder.output_stride == 16 and AnySize(model).multiple == 16
        with pytest.raises(RuntimeError, match='must match the size'):
            model(torch.randn(1, 3, 112, 144))
        assert AnySize(model, multiple=32)(torch.randn(1, 3, 97, 131)).shape == (1, 2, 97, 131)


# ---------------------------------------------------------------------------------------------------- SMP

@pytest.mark.parametrize('arch', ['Unet', 'FPN', 'UPerNet', 'Segformer'])
def test_smp_decoders_at_any_size(arch):
    smp = pytest.importorskip('segmentation_models_pytorch')
    from cpvt_backbones.adapters.smp import AnySize
    torch.manual_seed(0)
    model = getattr(smp, arch)('tu-pcpvt_tiny', encoder_weights=None, classes=3).eval()
    wrapped = AnySize(model)
    assert wrapped.multiple == (1 if arch == 'Unet' else 32)
    forced = AnySize(model, multiple=32)
    x = torch.randn(2, 3, 97, 131)
    padded = torch.nn.functional.pad(x, (0, 29, 0, 31))  # to 128 x 160
    with torch.no_grad():
        if arch != 'Unet':
            with pytest.raises(RuntimeError, match='divisible by 32'):
                model(x)
        assert torch.equal(forced(x), model(padded)[..., :97, :131])
        out = wrapped(x)
        assert out.shape == (2, 3, 97, 131)
        assert torch.equal(out, model(x) if arch == 'Unet' else model(padded)[..., :97, :131])


def test_any_size_modes_and_outputs():
    from cpvt_backbones.adapters.smp import AnySize

    class Two(torch.nn.Module):
        def forward(self, x):
            return dict(mask=x * 2, label=x.mean((2, 3)), nested=[x[:, :1]])
    x = torch.randn(1, 2, 5, 7)
    for mode in ('constant', 'reflect', 'replicate'):
        out = AnySize(Two(), multiple=4, mode=mode)(x)
        assert torch.equal(out['mask'], x * 2) and out['nested'][0].shape == (1, 1, 5, 7)
        want = torch.nn.functional.pad(x, (0, 1, 0, 3), mode=mode).mean((2, 3))
        assert torch.allclose(out['label'], want)
    with pytest.raises(ValueError, match="mode='reflect' pads by less"):
        AnySize(Two(), multiple=16, mode='reflect')(x)
    with pytest.raises(ValueError, match='pass multiple='):
        AnySize(Two())


# ---------------------------------------------------------------------------------------------------- torchvision

def _detection_data(masks):
    torch.manual_seed(0)
    images = [torch.rand(3, 61, 83), torch.rand(3, 77, 59)]
    targets = []
    for image in images:
        target = dict(boxes=torch.tensor([[5., 6., 40., 50.]]), labels=torch.tensor([1]))
        if masks:
            target['masks'] = torch.zeros(1, *image.shape[-2:], dtype=torch.uint8)
            target['masks'][:, 6:50, 5:40] = 1
        targets.append(target)
    return images, targets


SMALL = dict(min_size=64, max_size=96)
SMALL_RCNN = dict(SMALL, rpn_pre_nms_top_n_train=100, rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_train=50,
                  rpn_post_nms_top_n_test=50, box_batch_size_per_image=32, box_detections_per_img=10)


def _retinanet(detection, ops, fpn):
    return detection.RetinaNet(fpn('pcpvt_tiny', out_indices=(1, 2, 3), out_channels=64,
                                   extra_blocks=ops.LastLevelP6P7(64, 64)), num_classes=3, **SMALL)


def _maskrcnn(detection, ops, fpn):
    return detection.MaskRCNN(fpn('pcpvt_tiny', out_channels=64), num_classes=3, **SMALL_RCNN)


def _fasterrcnn(detection, ops, fpn):
    return detection.FasterRCNN(fpn('cpvt_tiny', out_channels=64, **_depth_two('cpvt_tiny')), num_classes=3,
                                **SMALL_RCNN)


def _fcos(detection, ops, fpn):
    return detection.FCOS(fpn('pcpvt_tiny', out_indices=(1, 2, 3), out_channels=64,
                              extra_blocks=ops.LastLevelP6P7(64, 64)), num_classes=3, **SMALL)


@pytest.mark.parametrize('build', [_retinanet, _maskrcnn, _fasterrcnn, _fcos])
def test_torchvision_detectors_train_and_infer_on_odd_sizes(build):
    pytest.importorskip('torchvision')
    from torchvision.models import detection
    from torchvision.ops import feature_pyramid_network as ops

    from cpvt_backbones.adapters.torchvision import cpvt_fpn_backbone
    masks = build is _maskrcnn
    images, targets = _detection_data(masks)
    torch.manual_seed(0)
    model = build(detection, ops, cpvt_fpn_backbone).train()
    losses = model(images, targets)
    sum(losses.values()).backward()
    assert all(torch.isfinite(v) for v in losses.values())
    assert model.backbone.body.patch_embed.proj.weight.grad is not None if build is _fasterrcnn else \
        model.backbone.body.patch_embeds[0].proj.weight.grad is not None
    model.eval()
    with torch.no_grad():
        out = model(images)
    assert len(out) == 2 and all({'boxes', 'scores', 'labels'} <= set(o) for o in out)
    for o, image in zip(out, images, strict=False):
        assert (o['boxes'][:, 2] <= image.shape[2]).all() and (o['boxes'][:, 3] <= image.shape[1]).all()
        if masks:
            assert o['masks'].shape[-2:] == image.shape[-2:]


def test_fpn_backbone_outputs():
    pytest.importorskip('torchvision')
    from cpvt_backbones.adapters.torchvision import cpvt_fpn_backbone
    backbone = cpvt_fpn_backbone('pcpvt_tiny', out_channels=32).eval()
    with torch.no_grad():
        out = backbone(torch.randn(1, 3, 97, 131))
    assert backbone.out_channels == 32 and list(out) == ['0', '1', '2', '3', 'pool']
    assert [tuple(v.shape[-2:]) for v in out.values()] == [(25, 33), (13, 17), (7, 9), (4, 5), (2, 3)]


# ---------------------------------------------------------------------------------------------------- export bound

@pytest.mark.heavy
def test_exported_program_size_bound():
    """torch.export of a dense pyramid backbone with dynamic H and W takes H, W >= 33 (torch's own guards from
    reshaping and channels-last strides that size 1 would change: the stride-32 map must have 2 or more rows and
    columns); inside the bound it equals eager, below it refuses by name."""
    from cpvt_backbones.compat import supports
    if not supports('export'):
        pytest.skip('needs torch.export with Dim.DYNAMIC')
    torch.manual_seed(0)
    model = create_model('pcpvt_tiny', features_only=True, depths=(1, 1, 1, 1)).eval()
    dynamic = torch.export.Dim.DYNAMIC
    with torch.no_grad():
        program = torch.export.export(model, (torch.randn(2, 3, 224, 224),),
                                      dynamic_shapes=({0: dynamic, 2: dynamic, 3: dynamic},))
    module = program.module()
    for hw in ((33, 33), (33, 131), (97, 131), (224, 224)):
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            assert all(torch.equal(a, b) for a, b in zip(module(x), model(x), strict=False)), hw
    with pytest.raises(Exception, match='33'):
        module(torch.randn(2, 3, 32, 64))
