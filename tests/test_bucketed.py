"""Bucketed shapes (``cpvt_backbones.deploy.bucketed``, ``prepare(..., bucket=step)``): inputs padded to multiples
of the step and run with their valid sizes give what their own sizes give, on the fused engine and on OpenVINO
(converted with valid sizes, compiled once per bucket); refusals by name."""
import pytest
import torch
from torch_features import skip_module_without

from cpvt_backbones import CPVT, PyramidCPVT, prepare, run_images
from cpvt_backbones.deploy.batched import pad_images
from cpvt_backbones.deploy.bucketed import Bucketed, largest_stride

skip_module_without('export')
ov_engine = pytest.importorskip('cpvt_backbones.deploy.openvino')
needs_openvino = pytest.mark.skipif(not ov_engine.available(), reason="openvino is not installed "
                                    "(pip install 'cpvt_backbones[openvino]'; make env installs it)")

TOLERANCE = 1e-5   # relative L2 against the model at each input's own size (measured: 1e-7 to 1e-6)
# One padded batch of odd sizes, then single images; at step 16 they fall into four buckets.
BATCH = ((1, 1), (7, 20), (33, 47))
ALONE = ((64, 64), (65, 9), (40, 30), (64, 64))


def pyramid(**kwargs):
    """Two stages (strides 4 and 8), zero-padded PEGs, the first stage's keys spatially reduced."""
    torch.manual_seed(0)
    return PyramidCPVT(embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), mlp_ratios=(2, 2), sr_ratios=(2, 1),
                       patch_sizes=(4, 2), features_only=True, num_classes=0, **kwargs).eval()


def errors(got, ref):
    got, ref = (t if isinstance(t, (tuple, list)) else (t,) for t in (got, ref))
    assert [g.shape for g in got] == [r.shape for r in ref]
    return max(float((g - r).norm() / r.norm()) for g, r in zip(got, ref, strict=True))


def check_exact(engine, model):
    """``engine`` (bucketed) against ``model`` at each input's own size: a padded batch with its valid sizes,
    then single images."""
    generator = torch.Generator().manual_seed(0)
    x, sizes = pad_images([torch.randn(3, *hw, generator=generator) for hw in BATCH])
    with torch.no_grad():
        assert errors(engine(x, valid_sizes=sizes), model(x, valid_sizes=sizes)) < TOLERANCE
        for hw in ALONE:
            x = torch.randn(1, 3, *hw, generator=generator)
            assert errors(engine(x), model(x)) < TOLERANCE, hw


@pytest.mark.parametrize('engine', ['fused', pytest.param('openvino', marks=needs_openvino)])
def test_every_size_runs_at_a_bucket_and_gets_what_its_own_size_gets(engine):
    model = pyramid()
    options = dict(shapes='static', cache_size=2) if engine == 'openvino' else {}
    bucketed = prepare(model, engine, bucket=16, **options)
    assert isinstance(bucketed, Bucketed) and largest_stride(model) == 8
    check_exact(bucketed, model)
    assert bucketed.buckets == {(48, 48): 1, (64, 64): 2, (80, 16): 1, (48, 32): 1}
    if engine == 'openvino':   # compiled once per bucket, the two most recent kept
        assert bucketed.module.compiled_shapes == ((1, 3, 48, 32), (1, 3, 64, 64))
        # the images of many sizes batched through run_images: each output the one it gets alone
        images = [torch.randn(3, *hw) for hw in BATCH + ALONE]
        with torch.no_grad():
            for image, out in zip(images, run_images(bucketed, images, batch_size=3), strict=True):
                assert errors(out, tuple(m[0] for m in model(image[None]))) < TOLERANCE


def test_a_classifier_keeps_its_logits():
    torch.manual_seed(0)
    model = CPVT(embed_dim=32, depth=2, num_heads=2, num_classes=5, class_token=False,
                 pos_encoding=dict(type='peg', positions=(0, 1))).eval()
    bucketed = prepare(model, 'fused', bucket=32)
    for hw in ((17, 45), (96, 33)):
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            assert bucketed(x).shape == (2, 5) and errors(bucketed(x), model(x)) < TOLERANCE


@pytest.mark.heavy
@needs_openvino
def test_a_sized_conversion_is_cached_apart_and_read_back(tmp_path):
    model = pyramid()
    cache = tmp_path / 'model.xml'
    plain = ov_engine.to_openvino(model, cache=str(cache))
    sized = ov_engine.to_openvino(model, cache=str(cache), valid_sizes=True)
    assert (tmp_path / 'model.valid_sizes.xml').is_file() and cache.is_file()
    assert type(plain) is ov_engine.OpenVINOModule and isinstance(sized, ov_engine.SizedOpenVINOModule)
    again = ov_engine.to_openvino(model, cache=str(cache), valid_sizes=True, shapes='dynamic')
    assert len(again.ov_model.inputs) == 2 and again.multiple == 8
    check_exact(Bucketed(again, 8), model)
    with pytest.raises(ValueError, match=r'multiples of 8, got \(97, 131\): pad the batch'):
        again(torch.randn(1, 3, 97, 131))


def test_refusals_name_the_problem():
    model = pyramid()
    with pytest.raises(ValueError, match="bucket=12 is not a multiple of the model's largest stride 8"):
        prepare(model, 'fused', bucket=12)
    with pytest.raises(ValueError, match='bucket must be a positive number of pixels'):
        prepare(model, 'fused', bucket=0)
    with pytest.raises(ValueError, match="engine 'onnxruntime' does not run valid sizes.*torch, fused, openvino"):
        prepare(model, 'onnxruntime', bucket=16)
    with pytest.raises(TypeError, match='must take valid_sizes.*Identity does not'):
        Bucketed(torch.nn.Identity(), 16)


@needs_openvino
def test_a_model_whose_valid_size_path_does_not_export_is_refused_by_name():
    with pytest.raises(ValueError, match='cannot be converted with valid_sizes: its valid-size path does not trace'):
        prepare(pyramid(pos_encoding='learned'), 'openvino', bucket=16)
