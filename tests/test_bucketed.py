"""Bucketed shapes (``cpvt_backbones.deploy.bucketed``, ``prepare(..., bucket=step)``): inputs padded to multiples
of the step and run with their valid sizes give what their own sizes give, on every engine the registry declares
as bucketing (OpenVINO converted with valid sizes, compiled once per bucket); refusals by name. And the valid
sizes that padding hands over: any integral numbers (numpy's too), ``check_finite`` over the valid region only."""
import warnings

import pytest
import torch
from torch_features import skip_module_without

from cpvt_backbones import CPVT, PyramidCPVT, prepare, run_images
from cpvt_backbones.deploy import ENGINES
from cpvt_backbones.deploy.batched import pad_images, takes_valid_sizes
from cpvt_backbones.deploy.bucketed import Bucketed, largest_stride
from cpvt_backbones.deploy.engines.torch import AutocastModule

skip_module_without('export')
ov_engine = pytest.importorskip('cpvt_backbones.deploy.engines.openvino')
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
    cache = tmp_path / 'model'
    plain = prepare(model, 'openvino', cache=str(cache))
    sized = prepare(model, 'openvino', cache=str(cache), sizes_input=True)
    assert (tmp_path / 'model.valid_sizes.xml').is_file() and (tmp_path / 'model.xml').is_file()
    assert type(plain) is ov_engine.OpenVINOModule and isinstance(sized, ov_engine.SizedOpenVINOModule)
    again = prepare(model, 'openvino', cache=str(cache), sizes_input=True, shapes='dynamic')
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


def test_a_module_without_valid_sizes_is_refused_before_the_engine_prepares_it(monkeypatch):
    """``bucket=`` on a module whose forward takes no valid sizes is refused by name on every bucketing engine
    before the engine's transform runs (no conversion, no calibration)."""
    import dataclasses

    def never(*args, **kwargs):
        raise AssertionError('the engine prepared the module')
    for name, spec in ENGINES.items():
        monkeypatch.setitem(ENGINES, name, dataclasses.replace(spec, transform=never))
    for name in (n for n, spec in ENGINES.items() if spec.bucketing is not None and not spec.missing()):
        with pytest.raises(TypeError, match='bucket=16: bucketed shapes pad inputs, so the module must take '
                                            'valid_sizes.*Conv2d does not'):
            prepare(torch.nn.Conv2d(3, 4, 1).eval(), name, bucket=16)


@needs_openvino
def test_a_model_whose_valid_size_path_does_not_export_is_refused_by_name():
    with pytest.raises(ValueError, match='cannot be converted with sizes_input: its valid-size path does not trace'):
        prepare(pyramid(pos_encoding='learned'), 'openvino', bucket=16)


# How far each precision may move a feature map (relative L2 against torch float32), as tests/test_engines.py takes
# the registry's docs table.
PRECISION_TOLERANCE = {'fp32': 1e-4, 'bf16': 5e-2, 'int8': 5e-2}


@pytest.mark.parametrize('engine, precision', [
    pytest.param(e, p, marks=pytest.mark.heavy) if e in ('openvino', 'onnxruntime') and p != 'fp32' else (e, p)
    for e, spec in ENGINES.items() if spec.bucketing is not None for p in spec.precisions])
def test_every_bucketing_engine_in_the_registry_takes_bucket(engine, precision):
    """Every engine the registry declares as bucketing (``Engine.bucketing``), at every precision it runs, takes
    ``bucket=64``: a padded batch of odd sizes and single images each get, within the precision's tolerance,
    what the float32 model gives them alone, and ``run_images`` batches the mixed sizes through it."""
    spec = ENGINES[engine]
    if spec.missing():
        pytest.skip(f'{engine} needs {spec.missing()}')
    if engine == 'fused' and precision == 'int8':
        from cpvt_backbones.deploy import kernels as fused
        if not fused.KERNELS['onednn_int8'].available():
            pytest.skip(fused.unavailable_reason('onednn_int8'))
    model = pyramid()
    generator = torch.Generator().manual_seed(0)
    images = [torch.randn(3, *hw, generator=generator) for hw in BATCH + ALONE]
    calibration = [image[None] for image in images] if precision == 'int8' else None
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='.*no native bf16')   # bf16 runs float32 there, saying so
        bucketed = prepare(model, engine, precision, calibration=calibration, bucket=64)
    assert isinstance(bucketed, Bucketed) and takes_valid_sizes(bucketed)
    x, sizes = pad_images(images[:len(BATCH)])
    with torch.no_grad():
        batch = bucketed(x, valid_sizes=sizes)
        for b, (image, hw) in enumerate(zip(images, BATCH, strict=False)):
            alone = model(image[None])
            got = [m[b:b + 1, :, :-(-hw[0] // s), :-(-hw[1] // s)] for m, s in zip(batch, model.strides, strict=True)]
            assert errors(got, alone) < PRECISION_TOLERANCE[precision], hw
        for image in images[len(BATCH):]:
            assert errors(bucketed(image[None]), model(image[None])) < PRECISION_TOLERANCE[precision]
        for image, out in zip(images, run_images(bucketed, images, batch_size=4), strict=True):
            assert errors(out, tuple(m[0] for m in model(image[None]))) < PRECISION_TOLERANCE[precision]
    assert set(bucketed.buckets) <= {(64, 64), (128, 64)}


def test_torch_bf16_hands_valid_sizes_on_so_run_images_pads_mixed_sizes():
    """The torch engine's bf16 (``AutocastModule``, built directly so that bf16 runs on any CPU) takes valid sizes
    where its model does, so ``run_images`` pads images of mixed sizes into one batch (one call of the model,
    with their valid sizes) and each output is the image's own; a module without them stays without."""
    model = pyramid()
    engine = AutocastModule(model)
    assert takes_valid_sizes(engine) and engine.strides == model.strides
    assert not takes_valid_sizes(AutocastModule(torch.nn.Conv2d(3, 4, 1)))
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs.get('valid_sizes')),
                                    with_kwargs=True)
    images = [torch.randn(3, *hw, generator=torch.Generator().manual_seed(i)) for i, hw in enumerate(BATCH)]
    outputs = run_images(engine, images, batch_size=len(images))
    assert len(calls) == 1 and calls[0].tolist() == [list(hw) for hw in BATCH]
    with torch.no_grad():
        for image, out in zip(images, outputs, strict=True):
            assert errors(out, tuple(m[0] for m in model(image[None]))) < PRECISION_TOLERANCE['bf16']


def test_valid_sizes_take_numpy_integers_and_refuse_what_is_not_a_size():
    """Valid sizes as numpy integers (an int64 array, numpy scalars in pairs) give what Python ints give; floats
    (whatever their value), booleans, sizes below 1 or beyond the batch are refused by name."""
    np = pytest.importorskip('numpy')
    model = pyramid()
    x, sizes = pad_images([torch.randn(3, *hw, generator=torch.Generator().manual_seed(0)) for hw in BATCH])
    with torch.no_grad():
        expected = model(x, valid_sizes=[list(hw) for hw in BATCH])
        for given in (np.array(BATCH, dtype=np.int64), np.array(BATCH, dtype=np.uint16),
                      [(np.int64(h), np.int32(w)) for h, w in BATCH], list(np.array(BATCH)), sizes.int()):
            assert all(torch.equal(a, b) for a, b in zip(model(x, valid_sizes=given), expected, strict=True))
        for given, error, match in (
                (np.array(BATCH, dtype=np.float64), TypeError, 'must hold integers.*numpy array of float64'),
                ([(1, 1), (7, 20), (np.float64(33), 47)], TypeError, 'pairs of ints'),
                ([(1, 1), (7, 20), (33.0, 47)], TypeError, 'pairs of ints'),
                ([(1, 1), (True, 20), (33, 47)], TypeError, 'pairs of ints'),
                (np.array([(1, 1), (7, 20), (0, 47)]), ValueError, r'within 1..33 \(height\)'),
                ([(1, 1), (7, 20), (np.int64(-3), 47)], ValueError, r'within 1..33 \(height\)'),
                ([(1, 1), (7, 20), (33, np.int64(48))], ValueError, r'1..47 \(width\)'),
                ([(1, 1), (7, 20), (2 ** 70, 47)], ValueError, r'within 1..33 \(height\)'),
                ([(1, 1), (7, 20, 3), (33, 47)], ValueError, r'\(h, w\) pairs')):
            with pytest.raises(error, match=match):
                model(x, valid_sizes=given)


def test_check_finite_checks_each_images_valid_region_only():
    """``check_finite=True`` refuses NaN or Inf inside an image's valid size, not in the padding beyond it (none
    of the image's pixels): there the image still gets what it gets alone."""
    model = pyramid(check_finite=True)
    images = [torch.randn(3, *hw, generator=torch.Generator().manual_seed(i)) for i, hw in enumerate(BATCH)]
    x, sizes = pad_images(images)
    x[0, :, 1:, :] = float('nan')    # beyond the 1 x 1 image
    x[1, :, :, 20:] = float('inf')   # beyond the 7 x 20 image
    with torch.no_grad():
        out = model(x, valid_sizes=sizes)
        for b, image in enumerate(images):
            alone = model(image[None])
            h, w = image.shape[-2:]
            got = [m[b:b + 1, :, :-(-h // s), :-(-w // s)] for m, s in zip(out, model.strides, strict=True)]
            assert errors(got, alone) < TOLERANCE
        with pytest.raises(ValueError, match='NaN or Inf values; expected finite'):
            model(x)   # without valid sizes, every pixel is the image's
        x[1, 0, 6, 19] = float('nan')   # inside the 7 x 20 image
        with pytest.raises(ValueError, match="1 NaN or Inf values within the images' valid sizes"):
            model(x, valid_sizes=sizes)
