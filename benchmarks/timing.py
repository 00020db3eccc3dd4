"""Measuring: interleaved timing with page-fault counts, peak memory, FLOPs, the matmul reference, the CPU and
allocator in use, and the three jobs built on them (a case against peers, cost against resolution, where the
time goes)."""
import contextlib
import ctypes
import gc
import os
import re
import resource
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from cpvt_backbones.compat import require

CASES = {
    'infer224': dict(mode='infer', batch=8, size=(224, 224)),
    'infer512': dict(mode='infer', batch=2, size=(512, 512)),
    'infer224_b1': dict(mode='infer', batch=1, size=(224, 224)),
    'infer512_b1': dict(mode='infer', batch=1, size=(512, 512)),
    'infer480x640': dict(mode='infer', batch=1, size=(480, 640)),
    'infer800x1216': dict(mode='infer', batch=1, size=(800, 1216)),
    'train512': dict(mode='train', batch=2, size=(512, 512)),
    'train224_b1': dict(mode='train', batch=1, size=(224, 224)),
}
SCALING_SIZES = (128, 256, 384, 512, 768, 1024, 1280, 1536)
_FLOP_FORMULAS_REGISTERED = False


def flop_counter() -> FlopCounterMode:
    """torch's FLOP counter, taught (on first use) the ops it does not know: the CPU flash-attention kernels,
    in-place ``addmm_`` (the fused engine's MKL residual GEMMs) and oneDNN's fused linear layers."""
    global _FLOP_FORMULAS_REGISTERED
    if not _FLOP_FORMULAS_REGISTERED:
        require('flop_formulas', 'counting FLOPs (the breakdown and the FLOP columns)')
        from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count
        aten = torch.ops.aten
        formulas = {
            aten._scaled_dot_product_flash_attention_for_cpu:
                lambda query, key, value, *args, out_shape=None, **kwargs: sdpa_flop_count(query, key, value),
            aten._scaled_dot_product_flash_attention_for_cpu_backward:
                lambda grad_out, query, key, value, *args, out_shape=None, **kwargs:
                sdpa_backward_flop_count(grad_out, query, key, value),
            aten.addmm_: lambda self, mat1, mat2, *args, out_shape=None, **kwargs: 2 * mat1[0] * mat1[1] * mat2[1],
        }
        if hasattr(torch.ops.mkldnn, '_linear_pointwise'):  # (M, K) input, (M, N) output; also .binary
            formulas[torch.ops.mkldnn._linear_pointwise] = \
                lambda x, *args, out_shape=None, **kwargs: 2 * x.numel() * out_shape[-1]
        for op, formula in formulas.items():
            try:
                register_flop_formula(op)(formula)
            except RuntimeError as err:  # registered already in this process
                if 'duplicate' not in str(err):
                    raise
        _FLOP_FORMULAS_REGISTERED = True
    return FlopCounterMode(display=False)


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


def gemm_libraries() -> list[str]:
    return ['mkl'] + (['onednn'] if hasattr(torch.ops.mkldnn, '_linear_pointwise') else [])


def has_fast_bf16(info: dict) -> bool:
    return bool({'avx512_bf16', 'amx_bf16'} & set(info['flags']))


# Idle time before each timed call: a runtime's worker threads keep spinning for a while after a call
# (onnxruntime's pool, OpenMP's), which would slow whatever is timed next on the same cores.
SETTLE_S = 0.1


def _timed(fn: Callable[[], None]) -> float:
    return _timed_faults(fn)[0]


def _timed_faults(fn: Callable[[], None]) -> tuple[float, int]:
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


def _vm(key: str) -> int | None:
    try:
        text = Path('/proc/self/status').read_text()
    except OSError:
        return None
    m = re.search(rf'^{key}:\s+(\d+) kB', text, re.M)
    return int(m.group(1)) if m else None


def _release_freed_memory() -> None:
    """Hand the memory glibc keeps after frees back to the OS, so that the resident set is the live memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL('libc.so.6').malloc_trim(0)


def peak_mb(model: torch.nn.Module, x: torch.Tensor, mode: str) -> float | None:
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
    with flop_counter() as counter:
        _step(model, x, mode)
    return counter.get_total_flops() / 1e9


def max_abs_diff(ref, out) -> float:
    return max((a - b).abs().max().item() for a, b in zip(ref, out, strict=False))


def run_case(impls: dict[str, torch.nn.Module], case: str, repeats: int, peers: tuple[str, ...],
             reference: str = 'fused') -> dict:
    """``impls[reference]`` against each of ``peers`` that ``impls`` has: outputs compared, then every
    implementation and the matmul references timed interleaved, ``repeats`` rounds after a warm-up one."""
    spec = CASES[case]
    mode = spec['mode']
    torch.manual_seed(0)
    x = torch.randn(spec['batch'], 3, *spec['size'])
    for model in impls.values():
        model.train(mode == 'train')
    outs, first = {}, {}
    with torch.inference_mode():
        for k, m in impls.items():  # the first call at this shape: compiles where an engine compiles
            start = time.perf_counter()
            outs[k] = m(x)
            first[k] = time.perf_counter() - start
    impls = {k: m for k, m in impls.items() if mode == 'infer' or not getattr(m, 'inference_only', False)}
    row = dict(name=case, shape=[spec['batch'], 3, *spec['size']], mode=mode, first_call_s=first)
    for peer in peers:
        row[f'max_abs_diff_{peer}'] = max_abs_diff(outs[reference], outs[peer]) if peer in impls else None
    del outs
    matmuls = {f'matmul_{lib}': Matmul(lib) for lib in gemm_libraries()}
    runs: dict[str, Callable[[], None]] = {k: partial(_step, m, x, mode) for k, m in impls.items()}
    runs.update(matmuls)
    times: dict[str, list[float]] = {k: [] for k in runs}
    faults: dict[str, list[int]] = {k: [] for k in runs}
    for rnd in range(repeats + 1):  # round 0 warms up
        for key, run in runs.items():
            elapsed, count = _timed_faults(run)
            if rnd:
                times[key].append(elapsed)
                faults[key].append(count)
    row['round_s'] = {key: times[key] for key in impls}  # every timed round, for paired A/B comparisons
    for key in (reference,) + tuple(peers):
        row[f'{key}_s'] = statistics.median(times[key]) if key in impls else None
        row[f'{key}_faults'] = statistics.median(faults[key]) if key in impls else None
        row[f'{key}_peak_mb'] = peak_mb(impls[key], x, mode) if key in impls else None
    row['gflops'] = gflops(impls[reference], x, mode)
    row[f'{reference}_gflops_per_s'] = row['gflops'] / row[f'{reference}_s']
    for key, matmul in matmuls.items():
        row[f'{key}_gflops'] = matmul.gflops(statistics.median(times[key]))
    row['matmul_gflops'] = max(row[f'{key}_gflops'] for key in matmuls)
    row['fraction_of_matmul'] = row[f'{reference}_gflops_per_s'] / row['matmul_gflops']
    return row


def scaling(model: torch.nn.Module, sizes, repeats: int) -> list[dict]:
    """``model``'s inference time, memory and FLOPs (attention's share too) against input pixels, batch 1."""
    model = model.eval()
    rows = []
    for size in sizes:
        x = torch.randn(1, 3, size, size)
        _step(model, x, 'infer')
        times = [_timed(partial(_step, model, x, 'infer')) for _ in range(repeats)]
        with flop_counter() as counter:
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
    with flop_counter() as counter:
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
