"""The torch engine's bf16 (``cpvt_backbones.deploy.engines.torch``): a backbone and a whole detector or segmentor under
autocast against float32 on the same weights at odd sizes, float32 outputs, the refusals and the fallback on a
CPU without native bf16."""
import copy
import warnings

import pytest
import torch
from shapes_models import shapes_model

from cpvt_backbones import create_model
from cpvt_backbones.compat import torch_at_least
from cpvt_backbones.deploy import prepare
from cpvt_backbones.deploy.engines import torch as autocast_module
from cpvt_backbones.deploy.engines.torch import AutocastModule

SIZES = ((1, 1), (97, 131), (7, 500))
# Relative L2 against float32 on random weights: measured 5e-3 to 1.3e-2 on torch 2.14/2.15, and up to 4.0e-2 for a
# RetinaNet output at 1 x 1 with torch 2.1.2 (both on a CPU without native bf16).
BF16_TOLERANCE = 3e-2 if torch_at_least('2.14') else 6e-2


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_backbone_under_bf16_autocast_at_odd_sizes(name):
    """AutocastModule runs the model in bf16 (built directly, so that it runs on any CPU: emulated where bf16 is
    not native) and hands back float32 maps close to the float32 model's; the model is left as it was."""
    torch.manual_seed(0)
    plain = create_model(name, features_only=True).eval()
    state = copy.deepcopy(plain.state_dict())
    engine = AutocastModule(plain)
    assert not engine.training and engine.state_dict().keys() == {f'module.{k}' for k in state}
    for hw in SIZES:
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            got, ref = engine(x), plain(x)
        assert type(got) is type(ref) and len(got) == len(ref) == 4
        for g, r in zip(got, ref, strict=False):
            assert g.dtype == torch.float32 and g.shape == r.shape and 0 < relative(g, r) < BF16_TOLERANCE, hw
    assert all(torch.equal(v, state[k]) for k, v in plain.state_dict().items())
    assert all(p.dtype == torch.float32 for p in plain.parameters())


def test_weights_made_under_inference_mode_run_in_bf16():
    """A copy made under ``torch.inference_mode()`` has inference tensors for weights; autocast's bf16 casts of
    them work, call after call."""
    torch.manual_seed(0)
    plain = create_model('pcpvt_tiny').eval()
    with torch.inference_mode():
        frozen = copy.deepcopy(plain)
    assert all(p.is_inference() for p in frozen.parameters())
    engine = AutocastModule(frozen)
    x = torch.randn(1, 3, 64, 80)
    with torch.inference_mode():
        out, again, ref = engine(x), engine(x), plain(x)
    assert torch.equal(out, again) and out.dtype == torch.float32 and relative(out, ref) < BF16_TOLERANCE


def test_without_native_bf16_it_warns_and_runs_float32(monkeypatch):
    monkeypatch.setattr(autocast_module, 'native_bf16', lambda device_type='cpu': False)
    model = create_model('pcpvt_tiny').eval()
    with pytest.warns(RuntimeWarning, match="precision='bf16': this CPU has no native bf16"):
        engine = prepare(model, 'torch', 'bf16')
    assert engine is model
    monkeypatch.setattr(autocast_module, 'native_bf16', lambda device_type='cpu': True)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert isinstance(prepare(model, 'torch', 'bf16'), AutocastModule)
    assert prepare(model, 'torch') is model


def test_refusals_name_the_problem():
    model = create_model('pcpvt_tiny').eval()
    with pytest.raises(ValueError, match="engine 'torch' runs fp32, bf16, not 'int8'; int8 runs on: fused, "
                                         'openvino, onnxruntime'):
        prepare(model, 'torch', 'int8')
    with pytest.raises(ValueError, match="precision must be one of .* got 'fp16'"):
        prepare(model, 'torch', 'fp16')
    with pytest.raises(ValueError, match="calibration configures no precision on engine 'torch'"):
        prepare(model, 'torch', 'bf16', calibration=[torch.randn(1, 3, 8, 8)])
    with pytest.raises(ValueError, match=r"engine 'torch': unknown option\(s\) \['threads'\]; its options are none"):
        prepare(model, 'torch', threads=2)


@pytest.mark.parametrize('config', ['retinanet_pcpvt-tiny_fpn_shapes.py', 'fpn_pcpvt-tiny_shapes.py'])
def test_detector_and_segmentor_under_autocast(config):
    """The torch engine's bf16 on an OpenMMLab model: backbone + neck + head in bf16, every tensor-mode output (scores
    and boxes of each level; the logits) float32 and close to float32 at odd sizes; ``predict`` runs the
    framework's post-processing on them; the state dict, ``eval()`` and ``to()`` are the model's own."""
    from torch.utils._pytree import tree_flatten

    from cpvt_backbones.deploy import openmmlab
    model = shapes_model(config)
    keys = set(model.state_dict())
    inputs = [torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(i)) for i, hw in enumerate(SIZES)]
    with torch.no_grad():
        expected = [tree_flatten(model._forward(x))[0] for x in inputs]
    openmmlab.attach_engine(model, AutocastModule(openmmlab.TensorForward(model)))
    assert set(model.state_dict()) == keys and model.eval() is model and model.to('cpu') is model
    for x, ref in zip(inputs, expected, strict=False):
        with torch.no_grad():
            got = tree_flatten(model._forward(x))[0]
        assert len(got) == len(ref) == (10 if 'retinanet' in config else 1)
        for g, r in zip(got, ref, strict=False):
            assert g.dtype == torch.float32 and g.shape == r.shape and relative(g, r) < BF16_TOLERANCE, x.shape
    if 'retinanet' in config:
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=dict(img_shape=(97, 131), ori_shape=(97, 131), scale_factor=(1., 1.)))
        with torch.no_grad():
            (result,) = model.predict(inputs[1], [sample])
        assert result.pred_instances.bboxes.dtype == torch.float32


def test_the_torch_engines_bf16_on_a_model_falls_back_like_the_backbone(monkeypatch):
    from cpvt_backbones.deploy.openmmlab import on_engine
    monkeypatch.setattr(autocast_module, 'native_bf16', lambda device_type='cpu': False)
    model = shapes_model('fpn_pcpvt-tiny_shapes.py')
    x = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        ref = model._forward(x)
        with pytest.warns(RuntimeWarning, match='no native bf16'):
            on_engine(model, 'torch', 'bf16')
        assert not hasattr(model, 'inference_engine') and torch.equal(model._forward(x), ref)


def test_a_wrapped_models_channels_come_from_its_backbone():
    """A whole model (the backbone a submodule, as in an OpenMMLab detector) on the torch engine takes the input
    channels of its backbone (``registry.in_chans_of``), which run_images checks a batch against."""
    model = torch.nn.Sequential(create_model('pcpvt_tiny', in_chans=1, features_only=True)).eval()
    assert AutocastModule(model).in_chans == 1
