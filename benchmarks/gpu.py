"""The Twins backbones on one CUDA GPU against timm's on the same weights: inference and a training step, float32
and bfloat16 autocast, eager and ``torch.compile``.

    python -m benchmarks.gpu [--models pcpvt_small svt_small] [--size 512] [--batch 16] [--repeats 10]
        [--deadline 270] [--json PATH]

Per (mode, precision, compilation) case the implementations run interleaved in one process: after warm-up
(compilation included), ``--repeats`` rounds each time every implementation once (CUDA events around the step),
so that clocks and other tenants weigh on all alike; medians are reported with images/s and the peak memory of
one step. Ours loads timm's weights through the package's converters (``load_into``), so both compute the same
function (their largest output difference is recorded). Cases not started before ``--deadline`` seconds are
listed as skipped rather than cut short (a compiled case takes 15-50 s to warm up on an H100); the JSON is
written after every case.
"""
import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from cpvt_backbones import create_model
from cpvt_backbones.convert.loading import load_into

TIMM_NAMES = {'pcpvt_small': 'twins_pcpvt_small', 'pcpvt_base': 'twins_pcpvt_base',
              'svt_small': 'twins_svt_small', 'svt_base': 'twins_svt_base'}
CASES = [(mode, precision, compiled) for compiled in (False, True) for mode in ('infer', 'train')
         for precision in ('float32', 'bfloat16')]


def pair(name: str, device: torch.device) -> dict[str, torch.nn.Module]:
    """Ours and timm's ``name`` with timm's (random, seeded) weights in both."""
    import timm
    torch.manual_seed(0)
    theirs = timm.create_model(TIMM_NAMES[name], pretrained=False)
    ours = create_model(name)
    load_into(ours, theirs.state_dict(), strict=True, source=f'timm {TIMM_NAMES[name]}')
    return {f'{name} (ours)': ours.to(device), f'{TIMM_NAMES[name]} (timm)': theirs.to(device)}


def step_fn(model: torch.nn.Module, x: torch.Tensor, mode: str, precision: str):
    """One inference forward, or one training step (forward, loss, backward, AdamW step)."""
    dtype = torch.bfloat16 if precision == 'bfloat16' else None
    if mode == 'infer':
        model.eval()

        @torch.inference_mode()
        def run():
            with torch.autocast('cuda', dtype=dtype, enabled=dtype is not None):
                return model(x)
        return run
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    target = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)

    def run():
        with torch.autocast('cuda', dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x).float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return run


def timed(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def run_case(models: dict[str, torch.nn.Module], x: torch.Tensor, mode: str, precision: str, compiled: bool,
             repeats: int) -> dict:
    fns = {}
    for name, model in models.items():
        target = torch.compile(model) if compiled else model
        fns[name] = step_fn(target, x, mode, precision)
    warm = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        warm[name] = round(time.perf_counter() - start, 1)
    peaks = {}
    for name, fn in fns.items():
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peaks[name] = round(torch.cuda.max_memory_allocated() / 2 ** 20)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    out = {}
    for name in fns:
        ms = statistics.median(times[name])
        out[name] = dict(ms=round(ms, 2), images_per_s=round(x.shape[0] / ms * 1000, 1), peak_mib=peaks[name],
                         warmup_s=warm[name])
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', nargs='+', default=['pcpvt_small', 'svt_small'], choices=sorted(TIMM_NAMES))
    p.add_argument('--size', type=int, default=512)
    p.add_argument('--batch', type=int, default=16)
    p.add_argument('--repeats', type=int, default=10)
    p.add_argument('--deadline', type=float, default=270., help='seconds after which no new case starts')
    p.add_argument('--json', type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit('[gpu] needs a CUDA GPU')
    started = time.perf_counter()
    device = torch.device('cuda')
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, size=args.size, batch=args.batch,
                  repeats=args.repeats, cases=[], skipped=[], agreement={})
    import timm
    result['timm'] = timm.__version__
    for name in args.models:
        models = pair(name, device)
        with torch.inference_mode():
            ours, theirs = (m.eval()(x[:2]) for m in models.values())
        result['agreement'][name] = float((ours - theirs).abs().max())
        for mode, precision, compiled in CASES:
            case = dict(model=name, mode=mode, precision=precision, compiled=compiled)
            if time.perf_counter() - started > args.deadline:
                result['skipped'].append(case)
                continue
            case['results'] = run_case(models, x, mode, precision, compiled, args.repeats)
            result['cases'].append(case)
            print(json.dumps(case), flush=True)
            if args.json:   # after every case, so that a run stopped by its time limit keeps what it finished
                args.json.write_text(json.dumps(result, indent=2))
            torch._dynamo.reset()
    result['wall_s'] = round(time.perf_counter() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == '__main__':
    main()
