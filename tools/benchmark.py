"""Speed and memory of our pyramid CPVT backbone, optimized (``cpvt_backbones.optimize``, the fused CPU path)
and plain, against mmseg's ``PCPVT``, timm's ``twins_pcpvt_*`` and onnxruntime running our ONNX export (what a
CPU deployer would pick instead); on CPUs with AVX512-BF16 or AMX also the plain model under bf16 autocast.

    python tools/benchmark.py [NAME ...] [--json PATH] [--repeats 5] [--cases infer224 infer512 ...]
                              [--retain-freed-memory]
    python tools/benchmark.py --scaling [--sizes 128 256 ...] [--json PATH] [--plot PATH]
    python tools/benchmark.py --breakdown [--cases ...] [--json PATH]
    make bench

All three get identical weights (ours -> timm unchanged, -> mmseg through ``convert.twins_to_mmseg``; mmseg's
encoder-layer LayerNorms are set to the official eps 1e-6, which it hard-codes to 1e-5), and their feature maps
are compared before anything is timed. Each case then runs the implementations interleaved (A B C A B C ...)
in one process after a warm-up round and reports medians. Inference runs under ``torch.inference_mode()``;
the training step is forward + backward of the sum of the maps' means (no optimizer), in train mode with
drop path 0. Peak memory is the rise of the process's resident-set high-water mark over one call (reset
through /proc/self/clear_refs, Linux only). GFLOPs are ours, counted by torch's FlopCounterMode with the CPU
flash-attention kernels registered: 2 FLOPs per multiply-add of every matmul, convolution and attention
product (backward included for the training step); norms, activations, softmax and adds are not counted.
The matmul rate is the practical limit: fp32 2048 x 2048 x 2048 products through MKL (``torch.mm``) and
through oneDNN (the two libraries the fused path chooses from), timed in the same interleaved rounds as the
models (the speed of a shared machine drifts from minute to minute); the faster median counts. (On AMD CPUs
MKL runs its AVX2 code even where oneDNN uses AVX-512.) Every result records the CPU's vector ISA and the
allocator settings, and each timed call's minor page faults: glibc returns large freed blocks to the OS, so a
model whose activations exceed its mmap threshold (at most 32 MiB) pays for fresh zeroed pages on every call.
``--retain-freed-memory`` makes glibc keep them (as onnxruntime's arena or jemalloc do) for every
implementation in the process, which shows how much of a difference is allocation rather than compute.
Names without an mmseg/timm counterpart (``cpvt_*``, ``pcpvt_tiny``) are timed alone.

``--breakdown`` profiles one call of ours per case (torch.profiler, self time of each op) and splits time and
FLOPs into GEMMs, attention, convolutions and the rest (norms, activations, adds, copies, Python), with each
kind's rate as a fraction of the matmul rate, and the ``ceiling``: the fraction the whole model would reach if
the rest took no time at all.
"""
import argparse
import copy
import ctypes
import gc
import json
import os
import platform
import re
import resource
import statistics
import sys
import time
from pathlib import Path
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

from cpvt_backbones import create_model, optimize
from cpvt_backbones.convert import twins_to_mmseg
from cpvt_backbones.models import PyramidCPVT, model_settings

CASES = {
    'infer224': dict(mode='infer', batch=8, size=(224, 224)),
    'infer512': dict(mode='infer', batch=2, size=(512, 512)),
    'infer800x1216': dict(mode='infer', batch=1, size=(800, 1216)),
    'train512': dict(mode='train', batch=2, size=(512, 512)),
}
SCALING_SIZES = (128, 256, 384, 512, 768, 1024, 1280, 1536)
PEERS = ('plain', 'mmseg', 'timm', 'onnxruntime', 'bf16')
aten = torch.ops.aten


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
def _sdpa_cpu_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _sdpa_cpu_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


@register_flop_formula(aten.addmm_)
def _addmm_inplace_flops(self, mat1, mat2, *args, out_shape=None, **kwargs) -> int:
    return 2 * mat1[0] * mat1[1] * mat2[1]  # shapes; the optimized model's MKL residual GEMMs


if hasattr(torch.ops.mkldnn, '_linear_pointwise'):  # the optimized model's fused linear layers (oneDNN)
    @register_flop_formula(torch.ops.mkldnn._linear_pointwise)
    def _onednn_linear_flops(x, *args, out_shape=None, **kwargs) -> int:
        return 2 * x.numel() * out_shape[-1]  # (M, K) input, (M, N) output; also the .binary overload


# ---------------------------------------------------------------------------------------------- the models
def build(name: str, peers: bool = True, onnx_dir: Optional[str] = None) -> Dict[str, Callable]:
    """{'ours': optimized, 'plain': ours unoptimized, 'mmseg', 'timm', 'onnxruntime' (with ``onnx_dir``),
    'bf16' (on CPUs with native bf16)}: each maps a batch to its tuple of four NCHW maps."""
    torch.manual_seed(0)
    classifier = create_model(name)
    weights = classifier.state_dict()
    plain = create_model(name, features_only=True)
    plain.load_state_dict({k: v for k, v in weights.items() if not k.startswith(('norm.', 'head.'))})
    impls = {'ours': optimize(copy.deepcopy(plain)), 'plain': plain}
    if has_fast_bf16(cpu_info()):
        impls['bf16'] = _Autocast(plain)
    if peers and name in ('pcpvt_small', 'pcpvt_base', 'pcpvt_large'):
        impls['mmseg'] = _mmseg(name, weights)
        impls['timm'] = _timm(name, weights)
    if peers and onnx_dir is not None:
        impls['onnxruntime'] = _OnnxRuntime(plain, Path(onnx_dir) / f'{name}.onnx')
    return impls


class _Autocast(torch.nn.Module):
    """The plain model under CPU bf16 autocast (where the CPU has native bf16 GEMMs)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            return tuple(o.float() for o in self.model(x))


class _OnnxRuntime(torch.nn.Module):
    """onnxruntime (CPU provider, default graph optimisations) on our ONNX export with dynamic H and W."""

    inference_only = True

    def __init__(self, model, path: Path):
        super().__init__()
        import onnxruntime as ort
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from export_onnx import export
        path.parent.mkdir(parents=True, exist_ok=True)
        export(model.eval(), str(path), [f'stride{s}' for s in model.strides])
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])

    def forward(self, x):
        return tuple(torch.from_numpy(o) for o in self.session.run(None, {'image': x.contiguous().numpy()}))


def _mmseg(name: str, weights) -> torch.nn.Module:
    from mmseg.models.backbones import PCPVT
    s = model_settings(name, PyramidCPVT)
    model = PCPVT(embed_dims=list(s['embed_dims']), patch_sizes=[4, 2, 2, 2], strides=[4, 2, 2, 2],
                  num_heads=list(s['num_heads']), mlp_ratios=list(s['mlp_ratios']), depths=list(s['depths']),
                  sr_ratios=list(s['sr_ratios']), out_indices=(0, 1, 2, 3), qkv_bias=True, norm_cfg=dict(type='LN'),
                  norm_after_stage=False, drop_path_rate=0.)
    model.load_state_dict(twins_to_mmseg(weights), strict=True)
    for layer_name, module in model.named_modules():
        if re.fullmatch(r'layers\.\d+\.\d+\.norm[12]', layer_name):
            module.eps = 1e-6
    return model


class _TimmFeatures(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return tuple(self.model.forward_intermediates(x, intermediates_only=True))


def _timm(name: str, weights) -> torch.nn.Module:
    import timm
    model = timm.create_model(f'twins_{name}', pretrained=False)
    model.load_state_dict(weights, strict=True)
    return _TimmFeatures(model)


# ---------------------------------------------------------------------------------------------- measuring
class Matmul:
    """The reference: an fp32 2048 x 2048 x 2048 product through ``library`` (``'mkl'``: ``torch.mm``;
    ``'onednn'``: oneDNN's linear), timed beside the models so that its rate and theirs come from the same
    minutes on a machine whose speed drifts."""

    n = 2048

    def __init__(self, library: str = 'mkl'):
        self.a, self.b = torch.randn(self.n, self.n), torch.randn(self.n, self.n)
        self.library = library

    def __call__(self) -> None:
        if self.library == 'onednn':
            torch.ops.mkldnn._linear_pointwise(self.a, self.b, None, 'none', [], '')
        else:
            torch.mm(self.a, self.b)

    def gflops(self, seconds: float) -> float:
        return 2 * self.n ** 3 / seconds / 1e9


def gemm_libraries() -> List[str]:
    return ['mkl'] + (['onednn'] if hasattr(torch.ops.mkldnn, '_linear_pointwise') else [])


def cpu_info() -> Dict:
    """The CPU model, the vector ISA torch dispatches to, and the flags that decide bf16 support."""
    text = Path('/proc/cpuinfo').read_text() if Path('/proc/cpuinfo').is_file() else ''
    model = re.search(r'^model name\s*:\s*(.+)$', text, re.M)
    flag_line = re.search(r'^flags\s*:\s*(.+)$', text, re.M)
    flags = set(flag_line.group(1).split()) if flag_line else set()
    wanted = ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile')
    return dict(cpu=model.group(1).strip() if model else platform.processor() or platform.machine(),
                isa=torch.backends.cpu.get_cpu_capability(), flags=[f for f in wanted if f in flags])


def has_fast_bf16(info: Dict) -> bool:
    return bool({'avx512_bf16', 'amx_bf16'} & set(info['flags']))


# Idle time before each timed call: a runtime's worker threads keep spinning for a while after a call
# (onnxruntime's pool, OpenMP's), which would slow whatever is timed next on the same cores.
SETTLE_S = 0.1


def _timed(fn: Callable[[], None]) -> float:
    return _timed_faults(fn)[0]


def _timed_faults(fn: Callable[[], None]) -> Tuple[float, int]:
    """Seconds of one call and the minor page faults it took (fresh pages the kernel had to zero)."""
    time.sleep(SETTLE_S)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


# glibc's mallopt parameters, and the thresholds --retain-freed-memory sets them to.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
RETAIN_LIMIT = 1 << 30


def retain_freed_memory(limit: int = RETAIN_LIMIT) -> None:
    """Make glibc keep freed memory for reuse instead of handing it back to the OS (as onnxruntime's arena,
    jemalloc or tcmalloc do). By default glibc serves blocks above its mmap threshold (at most 32 MiB) with
    fresh mappings and trims the heap top, so a model whose activations are larger pays a page fault per 4 KiB
    page of them on every call. Process-wide, so the benchmark applies it to every implementation alike."""
    try:
        libc = ctypes.CDLL('libc.so.6')
        done = libc.mallopt(M_MMAP_THRESHOLD, limit) and libc.mallopt(M_TRIM_THRESHOLD, limit)
    except (OSError, AttributeError) as err:
        raise RuntimeError(f'--retain-freed-memory needs glibc (libc.so.6 with mallopt): {err}') from err
    if not done:
        raise RuntimeError('glibc refused mallopt(M_MMAP_THRESHOLD / M_TRIM_THRESHOLD)')


def allocator_info(retained: bool) -> str:
    """What decides how this process allocates: our setting and any MALLOC_* / LD_PRELOAD in the environment."""
    settings = [f'{k}={v}' for k, v in sorted(os.environ.items()) if k.startswith('MALLOC_') or k == 'LD_PRELOAD']
    base = (f'glibc, freed memory retained (mmap and trim thresholds {RETAIN_LIMIT >> 30} GiB)' if retained
            else 'glibc defaults')
    return ', '.join([base] + settings)


def _step(model: torch.nn.Module, x: torch.Tensor, mode: str) -> None:
    if mode == 'infer':
        with torch.inference_mode():
            model(x)
    else:
        sum(o.mean() for o in model(x)).backward()
        model.zero_grad(set_to_none=True)


def _vm(key: str) -> Optional[int]:
    try:
        text = Path('/proc/self/status').read_text()
    except OSError:
        return None
    m = re.search(rf'^{key}:\s+(\d+) kB', text, re.M)
    return int(m.group(1)) if m else None


def _release_freed_memory() -> None:
    """Hand the memory glibc keeps after frees back to the OS, so that the resident set is the live memory."""
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_mb(model: torch.nn.Module, x: torch.Tensor, mode: str) -> Optional[float]:
    """Rise of the resident-set high-water mark over one call, in MiB (None where /proc cannot tell)."""
    gc.collect()
    _release_freed_memory()
    try:
        Path('/proc/self/clear_refs').write_text('5')
    except OSError:
        return None
    before = _vm('VmRSS')
    _step(model, x, mode)
    after = _vm('VmHWM')
    return None if before is None or after is None else (after - before) / 1024


def gflops(model: torch.nn.Module, x: torch.Tensor, mode: str) -> float:
    with FlopCounterMode(display=False) as counter:
        _step(model, x, mode)
    return counter.get_total_flops() / 1e9


def max_abs_diff(ref, out) -> float:
    return max((a - b).abs().max().item() for a, b in zip(ref, out))


def run_case(impls: Dict[str, torch.nn.Module], case: str, repeats: int) -> dict:
    spec = CASES[case]
    mode = spec['mode']
    torch.manual_seed(0)
    x = torch.randn(spec['batch'], 3, *spec['size'])
    for model in impls.values():
        model.train(mode == 'train')
    with torch.inference_mode():
        outs = {k: m(x) for k, m in impls.items()}
    impls = {k: m for k, m in impls.items() if mode == 'infer' or not getattr(m, 'inference_only', False)}
    row = dict(name=case, shape=[spec['batch'], 3, *spec['size']], mode=mode)
    for peer in PEERS:
        row[f'max_abs_diff_{peer}'] = max_abs_diff(outs['ours'], outs[peer]) if peer in impls else None
    del outs
    matmuls = {f'matmul_{lib}': Matmul(lib) for lib in gemm_libraries()}
    runs: Dict[str, Callable[[], None]] = {k: partial(_step, m, x, mode) for k, m in impls.items()}
    runs.update(matmuls)
    times: Dict[str, List[float]] = {k: [] for k in runs}
    faults: Dict[str, List[int]] = {k: [] for k in runs}
    for rnd in range(repeats + 1):  # round 0 warms up
        for key, run in runs.items():
            elapsed, count = _timed_faults(run)
            if rnd:
                times[key].append(elapsed)
                faults[key].append(count)
    row['round_s'] = {key: times[key] for key in impls}  # every timed round, for paired A/B comparisons
    for key in ('ours',) + PEERS:
        row[f'{key}_s'] = statistics.median(times[key]) if key in impls else None
        row[f'{key}_faults'] = statistics.median(faults[key]) if key in impls else None
        row[f'{key}_peak_mb'] = peak_mb(impls[key], x, mode) if key in impls else None
    row['gflops'] = gflops(impls['ours'], x, mode)
    row['ours_gflops_per_s'] = row['gflops'] / row['ours_s']
    for key, matmul in matmuls.items():
        row[f'{key}_gflops'] = matmul.gflops(statistics.median(times[key]))
    row['matmul_gflops'] = max(row[f'{key}_gflops'] for key in matmuls)
    row['fraction_of_matmul'] = row['ours_gflops_per_s'] / row['matmul_gflops']
    return row


def scaling(impls: Dict[str, torch.nn.Module], sizes, repeats: int) -> List[dict]:
    """Our inference time, memory and FLOPs (attention's share too) against input pixels, batch 1."""
    model = impls['ours'].eval()
    rows = []
    for size in sizes:
        x = torch.randn(1, 3, size, size)
        _step(model, x, 'infer')
        times = [_timed(partial(_step, model, x, 'infer')) for _ in range(repeats)]
        with FlopCounterMode(display=False) as counter:
            model(x)
        counts = counter.get_flop_counts()['Global']
        attention = sum(v for k, v in counts.items() if _kind(str(k)) == 'attention')
        total = counter.get_total_flops()
        rows.append(dict(size=size, megapixels=size * size / 1e6, seconds=statistics.median(times),
                         peak_mb=peak_mb(model, x, 'infer'), gflops=total / 1e9, attention_share=attention / total))
        print(f'[bench] {size}x{size}: {rows[-1]["seconds"]:.3f} s, {rows[-1]["peak_mb"]:.0f} MiB, '
              f'{rows[-1]["gflops"]:.1f} GFLOPs ({100 * rows[-1]["attention_share"]:.0f}% attention)', flush=True)
    return rows


# Op name fragments -> kind, first match wins (profiler names such as 'mkldnn::_linear_pointwise', FLOP
# counter names such as 'aten._scaled_dot_product_flash_attention_for_cpu.default').
KINDS = (('attention', ('scaled_dot_product',)), ('conv', ('convolution',)),
         ('gemm', ('_linear_pointwise', 'addmm', '::mm', '.mm', 'bmm')))


def _kind(op_name: str) -> str:
    return next((kind for kind, parts in KINDS if any(p in op_name for p in parts)), 'rest')


def breakdown(model: torch.nn.Module, case: str) -> dict:
    """Where one call of ``model`` spends its time, by kind of op, and at what rate each kind runs."""
    from torch.profiler import ProfilerActivity, profile
    spec = CASES[case]
    model.train(spec['mode'] == 'train')
    x = torch.randn(spec['batch'], 3, *spec['size'])
    _step(model, x, spec['mode'])
    matmul_gflops = max(m.gflops(min(_timed(m) for _ in range(5))) for m in map(Matmul, gemm_libraries()))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(model, x, spec['mode'])
    with FlopCounterMode(display=False) as counter:
        _step(model, x, spec['mode'])
    kinds = {k: dict(seconds=0., gflops=0.) for k, _ in KINDS + (('rest', ()),)}
    for event in prof.key_averages():
        kinds[_kind(event.key)]['seconds'] += event.self_cpu_time_total / 1e6
    for op, flops in counter.get_flop_counts()['Global'].items():
        kinds[_kind(str(op))]['gflops'] += flops / 1e9
    total_s = sum(k['seconds'] for k in kinds.values())
    total_gflops = sum(k['gflops'] for k in kinds.values())
    for k in kinds.values():
        k['share'] = k['seconds'] / total_s
        k['fraction_of_matmul'] = k['gflops'] / k['seconds'] / matmul_gflops if k['gflops'] else None
    return dict(name=case, shape=[spec['batch'], 3, *spec['size']], mode=spec['mode'], seconds=total_s,
                gflops=total_gflops, matmul_gflops=matmul_gflops,
                fraction_of_matmul=total_gflops / total_s / matmul_gflops,
                ceiling=total_gflops / (total_s - kinds['rest']['seconds']) / matmul_gflops, kinds=kinds)


# ---------------------------------------------------------------------------------------------- reporting
def _fmt(value, spec: str) -> str:
    return '-' if value is None else format(value, spec)


def table(rows: List[dict]) -> str:
    """Ours is the optimized model; ``x peer`` is the peer's time over ours."""
    lines = ['| case | shape | ours s | ' + ' | '.join(f'{p} s' for p in PEERS) + ' | '
             + ' | '.join(f'x {p}' for p in PEERS) + ' | ours img/s | GFLOPs | % of matmul | peak MiB ours / '
             + ' / '.join(PEERS) + ' | page faults per call, thousands, ours / ' + ' / '.join(PEERS)
             + ' | max diff ' + ' / '.join(PEERS) + ' |',
             '|---|---|---|' + '---|' * (2 * len(PEERS)) + '---|---|---|---|---|---|']
    for r in rows:
        times = ' | '.join(_fmt(r[f'{p}_s'], '.3f') for p in PEERS)
        ratios = ' | '.join(_fmt(r[f'{p}_s'] / r['ours_s'] if r[f'{p}_s'] else None, '.2f') for p in PEERS)
        peaks = ' / '.join(_fmt(r[f'{k}_peak_mb'], '.0f') for k in ('ours',) + PEERS)
        faults = ' / '.join(_fmt(r[f'{k}_faults'] / 1e3 if r[f'{k}_faults'] is not None else None, '.0f')
                            for k in ('ours',) + PEERS)
        diffs = ' / '.join(_fmt(r[f'max_abs_diff_{p}'], '.1e') for p in PEERS)
        lines.append(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | {r['ours_s']:.3f} | {times} | {ratios} "
                     f"| {r['shape'][0] / r['ours_s']:.2f} | {r['gflops']:.1f} | {100 * r['fraction_of_matmul']:.0f}% "
                     f"| {peaks} | {faults} | {diffs} |")
    return '\n'.join(lines)


def scaling_table(rows: List[dict]) -> str:
    lines = ['| input | megapixels | s | s per megapixel | peak MiB | GFLOPs | attention share |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['size']}x{r['size']} | {r['megapixels']:.3f} | {r['seconds']:.3f} "
                     f"| {r['seconds'] / r['megapixels']:.2f} | {_fmt(r['peak_mb'], '.0f')} | {r['gflops']:.1f} "
                     f"| {100 * r['attention_share']:.0f}% |")
    return '\n'.join(lines)


def breakdown_table(rows: List[dict]) -> str:
    kinds = list(rows[0]['kinds'])
    lines = ['| case | s (profiled) | % of matmul | ' + ' | '.join(f'{k}: time share, % of matmul' for k in kinds)
             + ' | ceiling (rest free) |', '|---|---|---|' + '---|' * len(kinds) + '---|']
    for r in rows:
        cells = [f"{100 * v['share']:.0f}%, " + ('-' if v['fraction_of_matmul'] is None else
                                                 f"{100 * v['fraction_of_matmul']:.0f}%") for v in r['kinds'].values()]
        lines.append(f"| {r['name']} | {r['seconds']:.3f} | {100 * r['fraction_of_matmul']:.0f}% | "
                     + ' | '.join(cells) + f" | {100 * r['ceiling']:.0f}% |")
    return '\n'.join(lines)


def plot_scaling(rows: List[dict], path: Path, name: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    mp = [r['megapixels'] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    for ax, key, label in ((axes[0], 'seconds', 'time per image (s)'), (axes[1], 'peak_mb', 'peak memory (MiB)')):
        values = [r[key] for r in rows]
        ax.loglog(mp, values, marker='o', label=name)
        ax.loglog(mp, [values[0] * m / mp[0] for m in mp], '--', color='grey', label='linear in pixels')
        ax.loglog(mp, [values[0] * (m / mp[0]) ** 2 for m in mp], ':', color='grey', label='quadratic in pixels')
        ax.set_xlabel('input megapixels')
        ax.set_ylabel(label)
        ax.set_ylim(min(values) / 2, max(values) * 2)
        ax.grid(alpha=.3, which='both')
        ax.legend(fontsize=8)
    fig.suptitle(f'{name} features, batch 1, {torch.get_num_threads()} threads', fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('names', nargs='*', default=['pcpvt_small'])
    parser.add_argument('--cases', nargs='+', choices=sorted(CASES), default=list(CASES))
    parser.add_argument('--repeats', type=int, default=5, help='timed rounds per case, after one warm-up round')
    parser.add_argument('--threads', type=int, help='torch threads (default: torch.get_num_threads())')
    parser.add_argument('--scaling', action='store_true', help='time/memory against input pixels instead')
    parser.add_argument('--breakdown', action='store_true', help='where our time goes, by kind of op')
    parser.add_argument('--sizes', type=int, nargs='+', default=list(SCALING_SIZES), help='for --scaling')
    parser.add_argument('--json', help='write the results here')
    parser.add_argument('--onnx-dir', default='work_dirs/bench_onnx', help='where our ONNX export is written')
    parser.add_argument('--no-onnx', action='store_true', help='leave onnxruntime out')
    parser.add_argument('--plot', default='benchmarks/results/scaling.png', help='for --scaling')
    parser.add_argument('--retain-freed-memory', action='store_true',
                        help='make glibc keep freed memory for reuse (see retain_freed_memory)')
    args = parser.parse_args()
    if args.retain_freed_memory:
        retain_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = dict(torch=torch.__version__, threads=torch.get_num_threads(), **cpu_info(),
                allocator=allocator_info(args.retain_freed_memory))
    print(f"[bench] {meta['cpu']}: {meta['isa']} ({', '.join(meta['flags']) or 'no AVX flags'}), "
          f"{meta['threads']} threads, torch {meta['torch']}, allocator: {meta['allocator']}", flush=True)
    result = dict(meta)
    if args.scaling:
        name = args.names[0]
        rows = scaling(build(name, peers=False), args.sizes, args.repeats)
        print(scaling_table(rows))
        plot_scaling(rows, Path(args.plot), name)
        print(f'[bench] plot: {args.plot}')
        result.update(name=name, scaling=rows)
    elif args.breakdown:
        name = args.names[0]
        model = build(name, peers=False)['ours']
        rows = [breakdown(model, case) for case in args.cases]
        print(f'\n{name}, one profiled call per case\n{breakdown_table(rows)}\n')
        result.update(name=name, breakdown=rows)
    else:
        result['cases'] = []
        for name in args.names:
            impls = build(name, onnx_dir=None if args.no_onnx else args.onnx_dir)
            rows = []
            for case in args.cases:
                rows.append(dict(run_case(impls, case, args.repeats), model=name))
                print(f'[bench] {name} {case}: ours {rows[-1]["ours_s"]:.3f} s', flush=True)
            print(f'\n{name} (times are medians of {args.repeats} interleaved rounds)\n{table(rows)}\n')
            result['cases'] += rows
        result['matmul_gflops'] = statistics.median(r['matmul_gflops'] for r in result['cases'])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f'[bench] wrote {args.json}')


if __name__ == '__main__':
    main()
