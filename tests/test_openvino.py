"""OpenVINO as the CPU engine (``cpvt_backbones.deploy.engines.openvino``): outputs against torch on the same weights
for both model families at odd sizes (every position encoding on the pyramid), the precisions, the shape strategies,
refusals."""
import builtins
import sys
from pathlib import Path

import pytest
import torch
from torch_features import skip_module_without

from cpvt_backbones import CPVT, PyramidCPVT, TwinsSVT, prepare
from cpvt_backbones.deploy.artifacts import ArtifactCache
from cpvt_backbones.deploy.check import trace_size
from cpvt_backbones.deploy.registry import EngineRequest
from cpvt_backbones.layers import ENCODINGS

skip_module_without('export')
from shapes_models import shapes_model  # noqa: E402

ov_engine = pytest.importorskip('cpvt_backbones.deploy.engines.openvino')
if not ov_engine.available():
    pytest.skip("openvino is not installed (pip install 'cpvt_backbones[openvino]'; make env installs it)",
                allow_module_level=True)

SIZES = ((1, 1), (97, 131), (7, 500))
FP32_TOLERANCE = 1e-5   # relative L2 against torch's float32 (measured: 1e-7 to 1e-6)
BF16_TOLERANCE = 3e-2   # measured 2e-3 to 9e-3 on random weights


def small(family: str, encoding: str, **kwargs):
    """A two-block CPVT or a two-stage, one-block-per-stage PCPVT (quick to export: the time goes to tracing,
    which grows with the blocks) with ``encoding``, as a feature pyramid. The pyramid's first stage attends to
    spatially reduced keys (stride 2 over a stride-4 map: a 1 x 1 input needs its padding), its second to all
    tokens, as the last stage of the paper's models does."""
    torch.manual_seed(0)
    if family == 'cpvt':
        encoding = dict(type=encoding, positions=(0, 1)) if encoding in ('peg', 'conv1x1') else encoding
        return CPVT(embed_dim=64, depth=2, num_heads=2, pos_encoding=encoding, features_only=True, num_classes=0,
                    **kwargs).eval()
    return PyramidCPVT(embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), mlp_ratios=(2, 2), sr_ratios=(2, 1),
                       patch_sizes=(4, 2), pos_encoding=encoding, features_only=True, num_classes=0, **kwargs).eval()


@pytest.fixture(scope='module')
def converted():
    """``converted(family, encoding)``: ``small(family, encoding)`` and its float32 OpenVINO engine, converted
    once for the tests that take the same model (under pytest-xdist those share a group, ``on_one_worker``)."""
    engines = {}

    def get(family, encoding):
        if (family, encoding) not in engines:
            model = small(family, encoding)
            engines[family, encoding] = model, prepare(model, 'openvino')
        return engines[family, encoding]
    return get


def prepare_openvino(model, *args, **kwargs):
    return prepare(model, 'openvino', *args, **kwargs)


def save_conversion(model, ov_model, prefix) -> Path:
    """Save ``ov_model`` as the float32 conversion of ``model`` in the engine's artifact cache at ``prefix`` (as
    the engine saves one); its .xml."""
    artifact = ArtifactCache(EngineRequest('openvino', cache=str(prefix)), model).conversion('.xml',
                                                                                          companions=('.bin',))
    ov_engine._save(artifact, ov_model)
    return artifact.path


def on_one_worker(family, encoding):
    """The pytest-xdist group of the tests that take ``converted(family, encoding)`` (``--dist loadgroup``)."""
    return pytest.mark.xdist_group(f'openvino_{family}_{encoding}')


def relative_errors(got, ref):
    assert type(got) is type(ref) and len(got) == len(ref)
    for g, r in zip(got, ref, strict=False):
        assert g.shape == r.shape and g.dtype == torch.float32
    return [float((g - r).norm() / r.norm()) for g, r in zip(got, ref, strict=False)]


def check_sizes(engine, model, tolerance, sizes=SIZES):
    for hw in sizes:
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(hw[0] * 1000 + hw[1]))
        with torch.no_grad():
            ref = model(x)
        errors = relative_errors(engine(x), ref)
        assert max(errors) < tolerance, (hw, errors)


# Every registered encoding on the pyramid (its attention also sees spatially reduced keys), several to a model
# (a conversion costs 10-25 s; encodings that act at different places combine: a table, an attention bias or
# rotation, a query/key input, a PEG); the plain PEG alone, which the tests below share. On the columnar model,
# whose blocks run the same encoding modules: the PEG, and a resized table with a rotary encoding.
PYRAMID_ENCODINGS = ('peg', 'learned+rpe+peg_qk', 'sincos+conv1x1+rope_mixed', 'rope_axial')
COLUMNAR_ENCODINGS = ('peg', 'learned+rope_mixed')


def test_the_pyramid_cases_cover_every_registered_encoding():
    assert {name for spec in PYRAMID_ENCODINGS for name in spec.split('+')} == set(ENCODINGS)


@pytest.mark.parametrize('family, encoding', [
    pytest.param(family, encoding, id=f'{family}-{encoding}',
                 marks=on_one_worker(family, encoding) if encoding == 'peg' else ())
    for family, encodings in (('cpvt', COLUMNAR_ENCODINGS), ('pcpvt', PYRAMID_ENCODINGS)) for encoding in encodings])
def test_float32_matches_torch_at_odd_sizes(family, encoding, converted):
    model, engine = converted(family, encoding)
    check_sizes(engine, model, FP32_TOLERANCE)


@pytest.mark.heavy
@pytest.mark.parametrize('window_mask', [True])   # the dense configs' form; tests/test_engines.py runs both
def test_svt_float32_matches_torch_at_odd_sizes(window_mask):
    """Twins-SVT's windowed blocks (padded windows, the padding masked out) beside its global ones convert once
    and match torch at every size: 1 x 1, a 7 x 500 strip, and 112 x 1024 and 448 x 448, whose last maps (stride 8
    in this two-stage model, as stride 32 in the paper's four) span several windows (traced where such a map is one
    window, the graph was recorded for one window and missed torch there by up to 9e-3:
    ``deploy.check.trace_size``). tests/test_engines.py runs a masked one at every precision."""
    torch.manual_seed(0)
    model = TwinsSVT(embed_dims=(16, 32), depths=(2, 2), num_heads=(1, 2), mlp_ratios=(2, 2), sr_ratios=(2, 1),
                     patch_sizes=(4, 2), window_sizes=(7, 7), window_mask=window_mask, features_only=True,
                     num_classes=0).eval()
    engine = prepare(model, 'openvino')
    check_sizes(engine, model, FP32_TOLERANCE, sizes=SIZES + ((112, 1024), (448, 448)))


def test_exports_trace_windowed_models_where_every_map_spans_several_windows():
    """Twins-SVT asked to convert at 28 x 28 (its stride-4 map one 7 x 7 window) is traced at its
    ``min_trace_side`` (2 windows x 7 tokens x stride 4 = 56; with more stages, the largest stage's) and matches
    torch where that map spans several windows; models without windows keep the size asked for."""
    torch.manual_seed(0)
    model = TwinsSVT(embed_dims=(8,), depths=(2,), num_heads=(1,), mlp_ratios=(2,), sr_ratios=(2,), patch_sizes=(4,),
                     window_sizes=(7,), window_mask=True, features_only=True, num_classes=0).eval()
    assert trace_size(model, (28, 28)) == (56, 56) and trace_size(model, (41, 300)) == (56, 300)
    two_stages = TwinsSVT(embed_dims=(8, 16), depths=(2, 2), num_heads=(1, 2), mlp_ratios=(2, 2), sr_ratios=(2, 1),
                          patch_sizes=(4, 2), window_sizes=(7, 7))
    assert trace_size(two_stages, (56, 56)) == (112, 112)
    pyramid = PyramidCPVT(embed_dims=(8,), depths=(1,), num_heads=(1,), mlp_ratios=(1,), sr_ratios=(1,),
                          patch_sizes=(4,))
    assert trace_size(pyramid, (56, 56)) == (56, 56)
    engine = prepare(model, 'openvino', example_size=(28, 28))
    check_sizes(engine, model, FP32_TOLERANCE, sizes=((32, 512), (120, 130)))


def test_classifier_output_and_the_shape_strategies():
    """'static' compiles every new shape and keeps the ``cache_size`` most recently used; 'auto' runs the dynamic
    model until a shape's ``specialise_after``-th call, then a model compiled for it; every call matches torch."""
    torch.manual_seed(0)
    model = CPVT(embed_dim=64, depth=2, num_heads=2, num_classes=7, class_token=False,
                 pos_encoding=dict(type='peg', positions=(0, 1))).eval()
    ov_model, spec = ov_engine.convert(model, torch.randn(2, 3, 32, 32))
    static = ov_engine.OpenVINOModule(ov_model, spec, 3, shapes='static', cache_size=2)
    auto = ov_engine.OpenVINOModule(ov_model, spec, 3, shapes='auto', cache_size=2, specialise_after=3)
    compiled = {'static': [], 'auto': []}
    for hw in ((33, 47), (64, 64), (33, 47), (5, 9), (33, 47), (5, 9), (5, 9), (64, 64)):
        x = torch.randn(3, 3, *hw)
        with torch.no_grad():
            ref = model(x)
        for engine in (static, auto):
            got = engine(x)
            assert isinstance(got, torch.Tensor) and got.shape == (3, 7)
            assert float((got - ref).norm() / ref.norm()) < FP32_TOLERANCE
            compiled[engine.shapes].append(engine.compiled_shapes)
    s1, s2, s3 = (3, 3, 33, 47), (3, 3, 64, 64), (3, 3, 5, 9)
    assert compiled['static'] == [(s1,), (s1, s2), (s2, s1), (s1, s3), (s3, s1), (s1, s3), (s1, s3), (s3, s2)]
    assert compiled['auto'] == [(), (), (), (), (s1,), (s1,), (s1, s3), (s1, s3)]  # (64, 64) met twice only
    assert 'static' in repr(static) and "'auto', cache_size=2, specialise_after=3" in repr(auto)


@on_one_worker('pcpvt', 'peg')
def test_bf16_runs_bf16_where_native_and_says_so_elsewhere(converted, tmp_path, monkeypatch):
    model, fp32 = converted('pcpvt', 'peg')
    # The conversion does not depend on the precision: bf16 compiles the float32 model, read from a cache file
    # as the tools read it (test_float32_matches_torch_at_odd_sizes checks that conversion).
    cache = str(tmp_path / 'pcpvt_peg')
    save_conversion(model, fp32.ov_model.clone(), cache)
    if ov_engine.native_bf16():
        check_sizes(prepare(model, 'openvino', 'bf16', cache=cache), model, BF16_TOLERANCE, SIZES[1:])
    monkeypatch.setattr(ov_engine, 'native_bf16', lambda: False)
    with pytest.warns(RuntimeWarning, match='no native bf16.*running float32'):
        engine = prepare(model, 'openvino', 'bf16', cache=cache)
    check_sizes(engine, model, FP32_TOLERANCE, SIZES[1:])


@on_one_worker('pcpvt', 'peg')
def test_int8_quantizes_a_saved_conversion_with_nncf_and_stays_close(converted, tmp_path, monkeypatch):
    """int8 with ``float_cache`` quantizes the float32 conversion saved there (nothing is converted again: the
    module names that keep_fp32 takes survive saving), stays close to torch and saves what it quantized."""
    model, fp32 = converted('pcpvt', 'peg')
    float_cache, cache = str(tmp_path / 'float'), str(tmp_path / 'int8')
    float_file = save_conversion(model, fp32.ov_model.clone(), float_cache)
    monkeypatch.setattr(ov_engine, 'convert', lambda *args: pytest.fail('converted again'))
    calibration = [torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    engine = prepare(model, 'openvino', 'int8', calibration=calibration, keep_fp32=['blocks.1'],
                                   cache=cache, float_cache=float_cache)
    ops = {op.get_type_name() for op in engine.ov_model.get_ops()}
    assert 'FakeQuantize' in ops or 'FakeConvert' in ops, 'NNCF inserted no quantization'
    assert (tmp_path / 'int8.xml').is_file() and (tmp_path / 'int8.bin').is_file()
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        ref = model(x)
    assert max(relative_errors(engine(x), ref)) < 0.1
    with monkeypatch.context() as quiet:   # read back: not quantized again
        quiet.setattr(ov_engine, 'quantize', lambda *args, **kwargs: pytest.fail('quantized again'))
        reread = prepare(model, 'openvino', 'int8', calibration=calibration, keep_fp32='blocks.1', cache=cache)
    assert max(relative_errors(reread(x), engine(x))) < 1e-5

    # A conversion saved by openvino.save_model alone (no module names, no record of its checksums) is converted
    # again, and saved anew with both.
    monkeypatch.undo()
    import openvino
    openvino.save_model(fp32.ov_model.clone(), float_file, compress_to_fp16=False)
    assert not openvino.Core().read_model(float_file).has_rt_info(ov_engine.MODULES_KEY)
    with pytest.warns(RuntimeWarning, match='float.xml does not have the sha256 recorded.*making it again'):
        again = prepare(model, 'openvino', 'int8', calibration=calibration, keep_fp32=['blocks.1'],
                                      float_cache=float_cache)
    assert max(relative_errors(again(x), ref)) < 0.1
    assert openvino.Core().read_model(float_file).has_rt_info(ov_engine.MODULES_KEY)  # saved anew, with them


@on_one_worker('pcpvt', 'peg')
def test_int8_keeps_the_named_modules_in_float32(converted):
    """keep_fp32 takes module names as optimize does: every converted operation knows its module, so the layers
    under a name get no quantizer (NNCF's ignored scope), the rest still do; a name that matches nothing is
    refused by name."""
    calibration = [torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    ov_model = converted('pcpvt', 'peg')[1].ov_model  # what ov_engine.convert gave the engine
    kept = ov_engine.ops_under(ov_model, ['blocks.1'])
    assert kept and all(name in {op.get_friendly_name() for op in ov_model.get_ops()} for name in kept)
    assert set(ov_engine.ops_under(ov_model, ['blocks'])) > set(kept)

    def quantized_inputs(keep_fp32):  # operations fed by a quantizer
        quantized = ov_engine.quantize(ov_model.clone(), calibration, keep_fp32)
        return {out.get_node().get_friendly_name() for op in quantized.get_ops()
                if op.get_type_name() == 'FakeQuantize' for out in op.output(0).get_target_inputs()}
    everything, partly = quantized_inputs(()), quantized_inputs(['blocks.1'])
    assert everything & set(kept) and not partly & set(kept) and partly
    with pytest.raises(ValueError, match=r"keep_fp32: no converted operation comes from a module under \['head'\]"):
        ov_engine.ops_under(ov_model, ['head'])


@on_one_worker('cpvt', 'peg')
def test_refusals_name_the_problem(converted, monkeypatch):
    model, engine = converted('cpvt', 'peg')
    with pytest.raises(ValueError, match="precision must be one of .*'fp16'"):
        prepare(model, 'openvino', 'fp16')
    with pytest.raises(ValueError, match='pass calibration='):
        prepare(model, 'openvino', 'int8')
    with pytest.raises(ValueError, match="calibration configures int8 on engine 'openvino'; precision='bf16'"):
        prepare(model, 'openvino', 'bf16', calibration=[torch.randn(1, 3, 32, 32)])
    with pytest.raises(ValueError, match='shapes must be one of'):
        prepare(model, 'openvino', shapes='ragged')
    with pytest.raises(ValueError, match='specialise_after must be an int of at least 1, got 0'):
        prepare(model, 'openvino', shapes='auto', specialise_after=0)
    with pytest.raises(ValueError, match='evaluation mode'):
        prepare_openvino(small('cpvt', 'peg').train())
    with pytest.raises(TypeError, match=r'converts a float32 model, this one has torch.float16 parameters: call '
                                        r'model.float\(\)'):
        prepare_openvino(small('cpvt', 'peg').eval().half())
    with pytest.raises(ValueError, match='4-D NCHW'):
        engine(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match='expected 3 input channels'):
        engine(torch.randn(1, 1, 32, 32))

    real_import = builtins.__import__

    def no_openvino(name, *args, **kwargs):
        if name == 'openvino' or name.startswith('openvino.'):
            raise ImportError('No module named openvino')
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, '__import__', no_openvino)
    monkeypatch.delitem(sys.modules, 'openvino')
    with pytest.raises(ImportError, match=r"pip install 'cpvt_backbones\[openvino\]'"):
        prepare(model, 'openvino')
    assert not ov_engine.available()


@pytest.mark.parametrize('config', ['retinanet_pcpvt-tiny_fpn_shapes.py', 'fpn_pcpvt-tiny_shapes.py'])
def test_detector_and_segmentor_tensor_outputs_match_torch(config):
    """``deploy.openmmlab.on_engine(model, 'openvino')``: backbone + neck + head of RetinaNet and Semantic FPN on
    OpenVINO give torch's tensor-mode outputs (every level's scores and boxes; the logits) at odd sizes."""
    from torch.utils._pytree import tree_flatten

    from cpvt_backbones.deploy.openmmlab import on_engine
    model = shapes_model(config)
    inputs = [torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(i)) for i, hw in enumerate(SIZES)]
    with torch.no_grad():
        expected = [tree_flatten(model._forward(x))[0] for x in inputs]
    on_engine(model, 'openvino')
    assert model.inference_engine.precision == 'fp32'
    for x, ref in zip(inputs, expected, strict=False):
        got = tree_flatten(model._forward(x))[0]
        assert len(got) == len(ref) == (10 if 'retinanet' in config else 1)
        for g, r in zip(got, ref, strict=False):
            assert g.shape == r.shape and float((g - r).norm() / r.norm()) < FP32_TOLERANCE, tuple(x.shape)


def test_two_stage_detectors_and_other_models_are_refused():
    from cpvt_backbones.deploy.openmmlab import dense_head

    class TwoStage(torch.nn.Module):
        def extract_feat(self, x):
            return x

        def _forward(self, x):
            return x
    model = TwoStage()
    model.roi_head = torch.nn.Identity()
    with pytest.raises(ValueError, match='has a roi_head: two-stage detectors'):
        dense_head(model)
    with pytest.raises(ValueError, match='not an OpenMMLab detector or segmentor'):
        dense_head(torch.nn.Linear(2, 2))


@on_one_worker('pcpvt', 'peg')
def test_a_saved_conversion_is_checked_before_use_and_made_again_when_it_fails(converted, tmp_path):
    """A conversion in the cache is read only where its record holds (``deploy.artifacts``, whose own tests damage
    it every way): one whose .bin was damaged, or one made from another model, is converted again with a warning
    naming the file and why, and saved anew."""
    model, fp32 = converted('pcpvt', 'peg')
    cache = tmp_path / 'm'
    path = save_conversion(model, fp32.ov_model.clone(), cache)
    weights = path.with_suffix('.bin')
    good = weights.read_bytes()
    weights.write_bytes(good[:1000] + bytes([good[1000] ^ 0xFF]) + good[1001:])
    with pytest.warns(RuntimeWarning, match=f'openvino cache {path}: {weights} does not have the sha256.*making it '
                                            'again'):
        engine = prepare(model, 'openvino', cache=str(cache))
    check_sizes(engine, model, FP32_TOLERANCE, SIZES[1:2])
    assert weights.read_bytes() == good   # saved anew
    other = small('pcpvt', 'peg')
    with torch.no_grad():
        other.blocks[0][0].mlp.fc1.weight.mul_(2)
    with pytest.warns(RuntimeWarning, match=f'openvino cache {path}: it was made from another model'):
        engine = prepare(other, 'openvino', cache=str(cache))
    check_sizes(engine, other, FP32_TOLERANCE, SIZES[1:2])


@on_one_worker('pcpvt', 'peg')
def test_an_unwritable_cache_is_skipped_with_a_warning(converted, tmp_path):
    model, _ = converted('pcpvt', 'peg')
    blocker = tmp_path / 'not_a_folder'
    blocker.write_text('')
    with pytest.warns(RuntimeWarning, match='openvino cache .*not_a_folder/m.xml not written .*running without it'):
        engine = prepare(model, 'openvino', cache=str(blocker / 'm'))
    check_sizes(engine, model, FP32_TOLERANCE, SIZES[1:2])


@on_one_worker('pcpvt', 'peg')
def test_one_module_called_from_several_threads(converted):
    """Concurrent calls (each compiled model keeps an infer request per concurrent call) give every caller its own
    input's outputs, for the dynamic model and for shape-specialised ones compiled while other threads run."""
    from concurrent.futures import ThreadPoolExecutor
    model, _ = converted('pcpvt', 'peg')
    engine = prepare(model, 'openvino', shapes='auto', specialise_after=3)
    inputs = [torch.randn(1, 3, 33 + 8 * (i % 3), 47, generator=torch.Generator().manual_seed(i)) for i in range(24)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(engine, inputs))
    for g, e in zip(got, expected, strict=False):
        assert max(relative_errors(g, e)) < FP32_TOLERANCE
    assert len(engine.compiled_shapes) == 3


def test_a_conversion_logs_no_traceback(capfd, caplog, monkeypatch):
    """Converting prints and logs no traceback: OpenVINO's front end warns, with a KeyError's traceback, about each
    operation it keeps whole that torch's decomposition table lacks (benign: such an operation is not decomposed
    anyway), the first time it converts in a process; ``convert`` drops exactly that warning."""
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder
    if hasattr(TorchFXPythonDecoder, '_decomp_table'):   # built (and warned about) once a process: build it here
        monkeypatch.setattr(TorchFXPythonDecoder, '_decomp_table', None)
    model = small('pcpvt', 'peg')
    engine = prepare(model, 'openvino', shapes='dynamic')
    x = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(engine(x), model(x), strict=True))
    err = capfd.readouterr().err
    assert 'Traceback' not in err and 'KeyError' not in err
    assert not [r for r in caplog.records if r.exc_info or 'decomp table' in r.getMessage()]


def test_a_model_that_cannot_be_converted_with_valid_sizes_is_refused_before_converting(capfd, monkeypatch):
    """``sizes_input=True`` (``prepare(..., 'openvino', bucket=...)``) refuses a model whose valid-size path works
    image by image (a learned table, a PEG padded other than with zeros), naming its modules, or one whose forward
    takes no valid sizes, before anything is exported or converted: nothing is printed."""
    from cpvt_backbones.deploy import ENGINES, prepare

    def never(*args, **kwargs):
        raise AssertionError('a conversion started')
    monkeypatch.setattr(ov_engine, 'convert', never)
    monkeypatch.setattr(torch.export, 'export', never)
    learned = small('pcpvt', 'learned')
    with pytest.raises(ValueError, match=r"cannot be converted with sizes_input: its valid-size path does not trace: "
                                         r"that of module\(s\) 'pos_embed' works image by image"):
        prepare_openvino(learned, sizes_input=True)
    with pytest.raises(ValueError, match=r"module\(s\) 'pos_block.0', 'pos_block.1' works image by image"):
        prepare_openvino(small('pcpvt', dict(type='peg', padding_mode='circular')), sizes_input=True)
    with pytest.raises(TypeError, match='cannot be converted with sizes_input: its forward takes no valid_sizes'):
        prepare_openvino(torch.nn.Conv2d(3, 4, 1).eval(), sizes_input=True)
    if not ENGINES['openvino'].missing():
        with pytest.raises(ValueError, match=r"module\(s\) 'pos_embed'"):
            prepare(learned, 'openvino', bucket=16)
        with pytest.raises(TypeError, match='bucket=16: bucketed shapes pad inputs, so the module must take '
                                            'valid_sizes.*Conv2d does not'):
            prepare(torch.nn.Conv2d(3, 4, 1).eval(), 'openvino', bucket=16)
    assert capfd.readouterr().err == ''
