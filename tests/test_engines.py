"""The engine room (``deploy.registry``): every engine runs every precision it declares and refuses the others by
name, the docs print the registry's table, onnxruntime as an engine, and the fused int8 contract."""
import copy
import json
import re
from pathlib import Path

import pytest
import torch
from torch_features import supports

from cpvt_backbones import PyramidCPVT, TwinsSVT, create_model
from cpvt_backbones.deploy import ENGINES, engine_table, prepare
from cpvt_backbones.deploy.registry import Engine, EngineRequest, register

ROOT = Path(__file__).resolve().parents[1]
# How far each precision may move a feature map (relative L2 against torch float32 on the same weights), as the
# registry's docs table states it.
TOLERANCE = {'fp32': 1e-4, 'bf16': 5e-2, 'int8': 5e-2}
# The docs' bound on static int8 far outside its calibrated ranges (a 1 x 1 input after calibrating at 224).
SATURATED_INT8 = {'fused': 1.0, 'onnxruntime': 1.5}


def small() -> torch.nn.Module:
    """A two-stage PCPVT (quick to export): spatially reduced keys in the first stage, all tokens in the second."""
    torch.manual_seed(0)
    return PyramidCPVT(embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), mlp_ratios=(2, 2), sr_ratios=(2, 1),
                       patch_sizes=(4, 2), features_only=True, num_classes=0).eval()


def small_svt(window_mask: bool = True) -> torch.nn.Module:
    """A one-stage Twins-SVT (quick to export: about a fifth of two stages' time): a windowed block, the
    PEG, a global block with spatially reduced keys; at 97 x 131 and 1 x 1 its windows are padded."""
    torch.manual_seed(0)
    return TwinsSVT(embed_dims=(16,), depths=(2,), num_heads=(1,), mlp_ratios=(2,), sr_ratios=(2,), patch_sizes=(4,),
                    window_sizes=(7,), window_mask=window_mask, features_only=True, num_classes=0).eval()


def runnable(engine: str, precision: str) -> None:
    """Skip where this machine lacks what the engine needs (a package, torch.export, int8 kernels)."""
    spec = ENGINES[engine]
    if spec.missing():
        pytest.skip(f'{engine} needs {spec.missing()}')
    if engine in ('openvino', 'onnxruntime') and not supports('export'):
        pytest.skip('the converting engines export with torch.export')
    if engine == 'fused' and precision == 'int8':
        from cpvt_backbones.deploy import kernels as fused
        if not fused.KERNELS['onednn_int8'].available():
            pytest.skip(fused.unavailable_reason('onednn_int8'))


def relative(got, ref):
    return max(float((g - r).norm() / r.norm()) for g, r in zip(got, ref, strict=False))


class quiet_bf16:
    """bf16 without native support warns and runs float32: the warning is the engine's, not a failure."""

    def __enter__(self):
        import warnings
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings('ignore', message='.*no native bf16')

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


@pytest.mark.parametrize('engine, precision', [(e, p) for e, spec in ENGINES.items() for p in spec.precisions])
def test_every_engine_runs_every_precision_it_declares(engine, precision, tmp_path):
    runnable(engine, precision)
    model = small()
    calibration = [torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    options = dict(cache=str(tmp_path / 'm')) if engine in ('openvino', 'onnxruntime') else {}
    with quiet_bf16():
        prepared = prepare(copy.deepcopy(model), engine, precision,
                           calibration=calibration if precision == 'int8' else None, **options)
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        assert relative(prepared(x), model(x)) < TOLERANCE[precision]


SVT_SIZES = ((64, 96), (97, 131), (1, 1))


@pytest.mark.parametrize('engine, precision', [
    pytest.param(e, p, marks=pytest.mark.heavy) if e in ('openvino', 'onnxruntime') and p != 'fp32' else (e, p)
    for e, spec in ENGINES.items() for p in spec.precisions])   # a converting engine: 20 s a precision
def test_svt_on_every_engine_at_every_precision_at_odd_sizes(engine, precision, tmp_path):
    """Twins-SVT (windowed blocks with padded, masked windows beside global ones) on every engine at every
    precision it declares, within the registry's tolerance of torch float32 on the same weights at sizes whose
    windows need padding and at 1 x 1 (int8: calibrated on batches of the sizes run)."""
    runnable(engine, precision)
    model = small_svt()
    calibration = [torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(i))
                   for i, hw in enumerate(SVT_SIZES * 2)]
    options = dict(cache=str(tmp_path / 'm')) if engine in ('openvino', 'onnxruntime') else {}
    with quiet_bf16():
        prepared = prepare(copy.deepcopy(model), engine, precision,
                           calibration=calibration if precision == 'int8' else None, **options)
    for hw in SVT_SIZES:
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(99 + hw[1]))
        with torch.no_grad():
            ref = model(x)
            got = prepared(x)
        assert [g.shape for g in got] == [r.shape for r in ref]
        assert relative(got, ref) < TOLERANCE[precision], hw


def test_an_engine_refuses_what_it_does_not_declare_naming_those_that_do():
    model = small()
    with pytest.raises(ValueError, match="engine 'onnxruntime' runs fp32, int8, not 'bf16'; bf16 runs on: torch, "
                                         "openvino"):
        prepare(model, 'onnxruntime', 'bf16')
    with pytest.raises(ValueError, match=r"unknown engine 'tensorrt'; the engines are \["):
        prepare(model, 'tensorrt')
    with pytest.raises(ValueError, match="calibration and keep_fp32 configure the calibrated precisions of engine "
                                         r"'torch' \(none\)"):
        prepare(model, 'torch', 'fp32', keep_fp32=['stages.0'])
    with pytest.raises(ValueError, match=r"engine 'fused': unknown option\(s\) \['gemms'\]; its options are gemm, "
                                         r"input_ranges"):
        prepare(model, 'fused', gemms='mkl')
    with pytest.raises(ValueError, match=r"engine 'fused': \['cache_dir'\] are fields of the request|unknown option"):
        prepare(model, 'fused', cache_dir='x')
    with pytest.raises(ValueError, match='evaluation mode'):
        prepare(small().train(), 'fused')
    with pytest.raises(ValueError, match="an engine named 'torch' is registered already"):
        register(Engine('torch', 'model', {'fp32': ''}, lambda *a: a[0], ''))
    with pytest.raises(ValueError, match='covers must be one of'):
        register(Engine('new', 'neck', {'fp32': ''}, lambda *a: a[0], ''))
    missing = Engine('needs_nothing_real', 'model', {'fp32': ''}, lambda *a: a[0], '',
                     requires=('no_such_package_here',), install='pip install it')
    ENGINES[missing.name] = missing
    try:
        with pytest.raises(ImportError, match="engine 'needs_nothing_real' needs no_such_package_here: pip install it"):
            EngineRequest('needs_nothing_real')
    finally:
        del ENGINES[missing.name]


def test_the_docs_print_the_registry():
    """docs/performance.md holds the registry's table as ``engine_table`` renders it: a precision an engine
    declares is in the docs, and nothing the registry does not declare."""
    text = (ROOT / 'docs/performance.md').read_text()
    assert engine_table() in text
    rows = {tuple(cell.strip() for cell in line.strip('|').split('|')[:3])
            for line in text.splitlines() if re.match(r'\| (torch|fused|openvino|onnxruntime) \|', line)}
    assert rows == {(e, spec.covers, p) for e, spec in ENGINES.items() for p in spec.precisions}


def test_onnxruntime_is_an_engine_at_any_size_with_a_checked_cache(tmp_path):
    runnable('onnxruntime', 'fp32')
    model = small()
    engine = prepare(model, 'onnxruntime', cache=str(tmp_path / 'm'))
    for hw in ((1, 1), (97, 131), (7, 500)):
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(hw[1]))
        with torch.no_grad():
            assert relative(engine(x), model(x)) < TOLERANCE['fp32'], hw
    saved = tmp_path / 'm.onnx'
    assert (tmp_path / 'm.onnx.record.json').is_file()
    stamp = saved.stat().st_mtime_ns
    prepare(model, 'onnxruntime', cache=str(tmp_path / 'm'))
    assert saved.stat().st_mtime_ns == stamp  # read back, not exported again
    saved.write_bytes(saved.read_bytes()[:-100])
    with pytest.warns(RuntimeWarning, match=f'onnxruntime cache {saved}: .*does not have the sha256.*making it again'):
        again = prepare(model, 'onnxruntime', cache=str(tmp_path / 'm'))
    x = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        assert relative(again(x), model(x)) < TOLERANCE['fp32']
    assert 'onnxruntime' in repr(again) or 'path=' in repr(again)


@pytest.mark.parametrize('engine, name', [('fused', 'pcpvt_tiny'), ('fused', 'cpvt_tiny'),
                                          ('onnxruntime', 'cpvt_tiny')])   # cpvt_tiny: the larger error at 1 x 1
def test_static_int8_contract_calibrated_sizes_and_beyond(engine, name, tmp_path):
    """The static int8 of the fused and the onnxruntime engines (deploy.ENGINES): within 0.03 relative L2 of
    float32 on inputs of the size it was calibrated at; far outside the calibrated ranges (a 1 x 1 input, nearly
    all padding, after calibrating at 224) activations saturate and the error grows to the bound the docs state
    (under 1 on the fused engine, 1.5 on onnxruntime's); calibrating on the sizes that will be run brings it
    back."""
    runnable(engine, 'int8')
    torch.manual_seed(0)
    model = create_model(name, features_only=True).eval()
    at_224 = [torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    tiny = torch.randn(1, 3, 1, 1, generator=torch.Generator().manual_seed(5))
    # onnxruntime: both quantizations start from one float32 export
    options = dict(float_cache=str(tmp_path / 'float')) if engine == 'onnxruntime' else {}
    int8 = prepare(copy.deepcopy(model), engine, 'int8', calibration=at_224, **options)
    with torch.no_grad():
        for hw in ((224, 224), (97, 131)):
            x = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(9))
            assert relative(int8(x), model(x)) < 0.03, hw
        assert relative(int8(tiny), model(tiny)) < SATURATED_INT8[engine]
        both = prepare(copy.deepcopy(model), engine, 'int8', calibration=at_224 + [torch.randn(4, 3, 1, 1)],
                       **options)
        assert relative(both(tiny), model(tiny)) < 0.1


def test_onnxruntime_int8_quantizes_the_linear_layers_less_those_kept(tmp_path):
    """onnxruntime's int8 quantizes what the fused engine's does, the linear layers, and leaves the modules in
    keep_fp32 alone; calibration that yields nothing and keep_fp32 that covers every linear layer are refused by
    name."""
    runnable('onnxruntime', 'int8')
    import onnx

    from cpvt_backbones.deploy.engines.onnxruntime import linear_nodes, quantize
    model = small()
    calibration = [torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    prepare(model, 'onnxruntime', 'int8', calibration=calibration, keep_fp32=['blocks.0'], cache=str(tmp_path / 'q'),
            float_cache=str(tmp_path / 'f'))
    assert len(linear_nodes(tmp_path / 'f.onnx')) == len(linears)
    recorded = json.loads((tmp_path / 'q.onnx.record.json').read_text())['calibration']
    assert recorded['batches'] == 2 and recorded['images'] == 4   # what the quantized model was calibrated on
    kept = len([n for n in linears if n.startswith('blocks.0.')])
    assert 0 < kept < len(linears)
    assert len(linear_nodes(tmp_path / 'f.onnx', ['blocks.0'])) == len(linears) - kept
    graph = onnx.load(str(tmp_path / 'q.onnx')).graph
    constants = {t.name for t in graph.initializer}
    quantized_weights = [n for n in graph.node if n.op_type == 'DequantizeLinear' and n.input[0] in constants]
    assert len(quantized_weights) == len(linears) - kept
    with pytest.raises(ValueError, match='covers every linear layer'):
        quantize(tmp_path / 'f.onnx', tmp_path / 'none.onnx', calibration, [n for n, _ in model.named_children()])


def test_a_new_engine_is_one_registry_entry(tmp_path):
    """What a new engine needs: its transform and one ``register`` call; ``prepare``, the tools' options, the
    table and the benchmarks then list it."""
    from benchmarks.peers import registered
    halves = Engine('halves', 'model', {'fp32': 'everything'}, lambda module, *a: module, 'a test engine')
    register(halves)
    try:
        model = small()
        assert prepare(model, 'halves') is model
        assert '| halves | model | fp32 | everything | torch |' in engine_table()
        assert 'halves' in registered()
        pytest.importorskip('mmengine')
        import argparse

        from cpvt_backbones.adapters.engines import add_engine_args
        parser = argparse.ArgumentParser()
        add_engine_args(parser)
        assert parser.parse_args(['--engine', 'halves']).engine == 'halves'
    finally:
        del ENGINES['halves']


@pytest.mark.parametrize('engine', [n for n, e in ENGINES.items() if 'example_size' in e.options])
def test_an_export_size_and_option_types_are_checked_before_anything_is_exported(engine):
    """``example_size`` below 2 x 2 (a side traced at 1 is fixed) or below twice the model's largest stride, or
    not two ints, and an option of the wrong type (OpenVINO's ``cache_size='8'``) are refused in one line naming
    the option."""
    runnable(engine, 'fp32')
    for size, says in (((1, 1), r'at least 2 x 2.*got \(1, 1\)'), ((8, 8), r'at least 16 x 16 \(twice the largest '
                                                                          r'stride of PyramidCPVT'),
                       ('224', r'\(height, width\), two ints'), ((224.0, 224), r'\(height, width\), two ints')):
        with pytest.raises(ValueError, match=f'example_size must be {says}'):
            prepare(small(), engine, example_size=size)
    if 'cache_size' in ENGINES[engine].options:
        with pytest.raises(ValueError, match="cache_size must be an int of at least 1, got '8'"):
            prepare(small(), engine, cache_size='8')
