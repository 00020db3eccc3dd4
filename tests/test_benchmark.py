"""benchmarks.speed: the implementations agree before anything is timed, and the JSON has its schema."""
import json
import os
from pathlib import Path

import pytest
from tool_server import run_tool
from torch_features import needs_torch

ROOT = Path(__file__).resolve().parents[1]
KEYS = {'name', 'shape', 'mode', 'fused_s', 'torch_s', 'mmseg_s', 'timm_s', 'onnxruntime_s', 'torch_bf16_s',
        'fused_int8_s', 'fused_peak_mb', 'torch_peak_mb', 'mmseg_peak_mb', 'timm_peak_mb', 'max_abs_diff_torch',
        'max_abs_diff_mmseg',
        'max_abs_diff_timm', 'max_abs_diff_onnxruntime', 'gflops', 'fused_gflops_per_s', 'matmul_mkl_gflops',
        'matmul_gflops', 'fraction_of_matmul', 'fused_faults', 'torch_faults', 'mmseg_faults', 'timm_faults'}


CONVERTING = ('--skip-engines', 'openvino', 'onnxruntime')  # the engines that export and convert: tested elsewhere


def run_benchmark(tmp_path, module, *args):
    """``python -m benchmarks.MODULE ARGS`` in tmp_path (relative output paths stay out of the clone), the
    benchmarks package found from the root."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get('PYTHONPATH')))))
    return run_tool(['-m', f'benchmarks.{module}', *args], tmp_path, env)


def bench(tmp_path, *args, repeats=1):
    out = tmp_path / 'bench.json'
    res = run_benchmark(tmp_path, 'speed', *args, '--repeats', str(repeats), '--json', out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(out.read_text()), res.stdout


@pytest.mark.heavy
@needs_torch('flop_formulas')  # the speed benchmark counts FLOPs
def test_peers_agree_and_schema(tmp_path):
    pytest.importorskip('mmseg')
    pytest.importorskip('timm')
    # a training step of one 224 px image (train512, 2 x 512 px, runs in the lower-precision and breakdown tests)
    result, stdout = bench(tmp_path, 'pcpvt_small', '--cases', 'infer224_b1', 'train224_b1', *CONVERTING)
    assert result['matmul_gflops'] > 0 and result['isa'] in stdout and result['cpu']
    infer, train = result['cases']
    assert set(infer) >= KEYS and infer['shape'] == [1, 3, 224, 224] and train['mode'] == 'train'
    assert set(train) >= KEYS and train['shape'] == [1, 3, 224, 224]
    for row in result['cases']:
        assert max(row[f'max_abs_diff_{p}'] for p in ('torch', 'mmseg', 'timm')) < 1e-4
        assert all(row[f'{k}_s'] > 0 for k in ('fused', 'torch', 'mmseg', 'timm'))
    assert all(row['matmul_gflops'] == max(row[f'matmul_{lib}_gflops'] for lib in ('mkl', 'onednn')
                                           if f'matmul_{lib}_gflops' in row) for row in result['cases'])
    assert abs(infer['gflops'] - 7.62) < 0.01  # one image at 224 (2 FLOPs per multiply-add)
    assert '| infer224_b1 |' in stdout


@needs_torch('flop_formulas')  # the speed benchmark counts FLOPs
def test_page_faults_counted_and_freed_memory_retained(tmp_path):
    """By default glibc hands the torch engine's (the plain model's) large freed activations back to the OS, so
    every call faults fresh pages in (about 14,000 per call for pcpvt_tiny at 2 x 512^2, 55 MiB); with
    --retain-freed-memory the timed calls (medians of five) reuse the warm-up's memory."""
    default, stdout = bench(tmp_path, 'pcpvt_tiny', '--cases', 'infer512', *CONVERTING, repeats=5)
    retained, retained_stdout = bench(tmp_path, 'pcpvt_tiny', '--cases', 'infer512', *CONVERTING,
                                      '--retain-freed-memory', repeats=5)
    assert default['allocator'].startswith('glibc defaults') and 'allocator: glibc defaults' in stdout
    assert retained['allocator'].startswith('glibc, freed memory retained') and 'retained' in retained_stdout
    (row,), (kept,) = default['cases'], retained['cases']
    assert row['torch_faults'] > 5_000 and kept['torch_faults'] < row['torch_faults'] / 10


@needs_torch('flop_formulas')  # the speed benchmark counts FLOPs
def test_lower_precisions_are_timed_beside_float32(tmp_path):
    """--precision int8 adds the fused engine's int8 (calibrated ranges), inference only, close to the float32
    maps; --precision bf16 the torch engine's bf16, the plain model under autocast (inference and training), where
    the CPU has native bf16."""
    from benchmarks.timing import has_fast_bf16
    from cpvt_backbones.utils import cpu_info
    result, stdout = bench(tmp_path, 'pcpvt_tiny', '--cases', 'infer224', 'train512', *CONVERTING, '--precision',
                           'int8', 'bf16')
    infer, train = result['cases']
    assert infer['fused_int8_s'] > 0 and 0 < infer['max_abs_diff_fused_int8'] < 0.5 and 'fused_int8 s' in stdout
    assert train['fused_int8_s'] is None  # training runs the float32 path: nothing of its own to time
    if has_fast_bf16(cpu_info()):
        assert infer['torch_bf16_s'] > 0 and train['torch_bf16_s'] > 0
        assert 0 < infer['max_abs_diff_torch_bf16'] < 0.5
    else:
        assert infer['torch_bf16_s'] is None and 'torch_bf16 left out: this CPU has no native bf16' in stdout


@needs_torch('flop_formulas')  # the speed benchmark counts FLOPs
def test_scaling_without_peers(tmp_path):
    result, _ = bench(tmp_path, 'pcpvt_tiny', '--scaling', '--sizes', '64', '160', '--plot', tmp_path / 's.png')
    rows = result['scaling']
    assert [r['size'] for r in rows] == [64, 160] and rows[1]['gflops'] > rows[0]['gflops'] > 0
    assert 0 < rows[0]['attention_share'] < 1 and (tmp_path / 's.png').stat().st_size > 0


@needs_torch('flop_formulas')
def test_breakdown_accounts_for_all_time_and_flops(tmp_path):
    result, stdout = bench(tmp_path, 'pcpvt_tiny', '--breakdown', '--cases', 'infer224', 'train512')
    for row in result['breakdown']:
        kinds = row['kinds']
        assert set(kinds) == {'gemm', 'attention', 'conv', 'rest'}
        assert abs(sum(k['share'] for k in kinds.values()) - 1) < 1e-9
        assert kinds['rest']['gflops'] == 0 and kinds['rest']['fraction_of_matmul'] is None
        assert all(kinds[k]['gflops'] > 0 and kinds[k]['seconds'] > 0 for k in ('gemm', 'attention', 'conv'))
        assert abs(sum(k['gflops'] for k in kinds.values()) - row['gflops']) < 1e-6
        assert row['ceiling'] > row['fraction_of_matmul'] > 0
    infer, train = result['breakdown']
    pixels = (2 * 512 * 512) / (8 * 224 * 224)
    assert train['gflops'] > 2.5 * pixels * infer['gflops']  # forward + backward: about 3x the forward's FLOPs
    assert '| infer224 |' in stdout and '| train512 |' in stdout


@pytest.mark.heavy
@needs_torch('export')
@needs_torch('flop_formulas')  # the speed benchmark counts FLOPs
def test_end_to_end_times_whole_models_on_every_engine(tmp_path):
    """--end-to-end: the demo's Semantic FPN (pcpvt_tiny; the paper's models take the same path, larger) in
    tensor mode, the torch engine (the model as it is) against the fused engine on its backbone and OpenVINO on
    the same weights; the engines' build times and first calls are reported."""
    pytest.importorskip('mmseg')
    pytest.importorskip('openvino')
    result, stdout = bench(tmp_path, '--end-to-end', 'semantic_fpn_shapes', '--cases', 'infer224_b1')
    (row,) = result['cases']
    assert row['model'] == 'semantic_fpn_shapes' and row['shape'] == [1, 3, 224, 224] and row['torch_s'] > 0
    assert row['max_abs_diff_fused'] < 1e-3 and row['max_abs_diff_openvino'] < 1e-3
    assert row['fused_s'] > 0 and row['openvino_s'] > 0 and row['setup_s']['openvino'] > 0
    assert set(row['first_call_s']) == {'torch', 'fused', 'openvino', 'onnxruntime'}  # every registered engine
    assert '| semantic_fpn_shapes | 1x3x224x224 |' in stdout


@needs_torch('export')
def test_openvino_by_hand_converts_our_plain_model_at_any_size():
    """The benchmark's 'OpenVINO by hand' (openvino.convert_model and compile_model at the plugin's defaults, no
    code of ours) gives our plain model's maps at sizes other than its example's: bf16 where the CPU has it."""
    pytest.importorskip('openvino')
    import torch

    from benchmarks.peers import _OpenVINOByHand
    from cpvt_backbones import create_model
    from cpvt_backbones.deploy.engines.openvino import native_bf16
    torch.manual_seed(0)
    plain = create_model('pcpvt_tiny', features_only=True).eval()
    by_hand = _OpenVINOByHand(plain)
    for hw in ((97, 131), (64, 40)):
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            ref = plain(x)
        got = by_hand(x)
        assert [g.shape for g in got] == [r.shape for r in ref]
        error = max(float((g - r).norm() / r.norm()) for g, r in zip(got, ref, strict=False))
        assert error < (3e-2 if native_bf16() else 1e-4), (hw, error)


@needs_torch('export')
def test_openvino_shapes_streams_every_strategy_from_the_registry(tmp_path):
    """benchmarks.openvino_shapes: every shape strategy of the registry's OpenVINO engine through a mixed and a
    recurring stream, cold and warm; 'static' compiles each new size, 'dynamic' none."""
    pytest.importorskip('openvino')
    out = tmp_path / 'shapes.json'
    res = run_benchmark(tmp_path, 'openvino_shapes', 'pcpvt_tiny', '--sizes', '33x47', '64x40', '--stream', '3',
                        '--recurring', '32x32', '--recurring-calls', '2', '--specialise-after', '2', '--settle', '0',
                        '--json', out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result['cpu']['isa'] and result['name'] == 'pcpvt_tiny'
    mixed, recurring = result['streams']['mixed'], result['streams']['recurring']
    assert (mixed['images'], mixed['distinct_sizes'], recurring['images']) == (3, 2, 2)
    for stream in (mixed, recurring):
        assert set(stream['strategies']) == {'dynamic', 'static', 'auto'}
        assert all(s['cold_total_s'] > 0 and s['warm_median_ms'] > 0 for s in stream['strategies'].values())
        assert stream['strategies']['dynamic']['compiles'] == 0
    assert mixed['strategies']['static']['compiles'] == 2 and result['convert_s'] > 0
