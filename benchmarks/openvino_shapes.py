"""OpenVINO's shape strategies (``deploy.engines.openvino``: dynamic, static, auto) on a stream of mixed sizes and on a
stream of recurring sizes.

    python -m benchmarks.openvino_shapes [NAME] [--sizes data/shapes/val/images | --sizes 480x640 ...]
        [--stream 150] [--recurring 480x640 800x1216] [--recurring-calls 200] [--specialise-after 64]
        [--cache-size 8] [--precision fp32|bf16] [--json PATH]

Two streams of batch-1 images: ``mixed``, ``--stream`` images whose sizes cycle through ``--sizes`` (by default
the native sizes of the demo's held-out scenes, ``data/shapes/val/images``, or a fixed list of eight sizes when
those are absent), and ``recurring``, ``--recurring-calls`` images cycling through the few ``--recurring`` sizes
(a camera's or a test loop's). Every engine is the registry's (``prepare(model, 'openvino', precision,
shapes=...)``) at its defaults but for ``--cache-size`` and ``--specialise-after``, all from one conversion of the
backbone ``NAME`` (random weights) saved to a temporary cache: the first ``prepare`` converts and saves it, each
strategy's reads it back (its build time is that read, the check of what was read, and the compile).

Per stream: first every strategy alone, from a fresh engine, through the whole stream (the cold pass: its total
includes every compile the strategy makes, the number of compiles, and the growth of the process's resident
memory); then all of them again, interleaved image by image after ``--settle`` seconds of idle time each (the
warm pass: median and total per-image time once the engines have met the stream, and per size where the
stream has at most eight). The CPU's vector ISA is printed with the figures.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from cpvt_backbones import create_model, prepare
from cpvt_backbones.deploy.engines.openvino import SHAPES
from cpvt_backbones.utils import cpu_info

ROOT = Path(__file__).resolve().parents[1]
FALLBACK_SIZES = ((480, 640), (512, 512), (384, 683), (600, 800), (256, 1024), (333, 500), (720, 540), (224, 224))


def rss_mb() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2 ** 20


def stream_sizes(spec: list[str]) -> list[tuple[int, int]]:
    """Sizes (h, w) from 'HxW' items or from the images of a folder (their native sizes, in file order)."""
    if len(spec) == 1 and Path(spec[0]).is_dir():
        from PIL import Image
        files = sorted(p for p in Path(spec[0]).iterdir() if p.suffix.lower() in ('.png', '.jpg', '.jpeg'))
        return [Image.open(p).size[::-1] for p in files]
    if spec:
        return [tuple(int(v) for v in s.lower().split('x')) for s in spec]
    folder = ROOT / 'data/shapes/val/images'
    return stream_sizes([str(folder)]) if folder.is_dir() else list(FALLBACK_SIZES)


def run_stream(model, cache: str, stream: list[tuple[int, int]], args) -> dict[str, dict]:
    """The cold pass (each strategy alone from a fresh engine, read from ``cache``) and the warm pass
    (interleaved) over ``stream``."""
    inputs = {hw: torch.randn(1, 3, *hw) for hw in set(stream)}
    engines, result = {}, {}
    for strategy in SHAPES:
        before, start = rss_mb(), time.perf_counter()
        engine = prepare(model, 'openvino', args.precision, shapes=strategy, cache_size=args.cache_size,
                         specialise_after=args.specialise_after, cache=cache)
        build_s = time.perf_counter() - start
        calls, compiles = [], 0
        for hw in stream:
            shape, known = (1, 3, *hw), engine.compiled_shapes
            start = time.perf_counter()
            engine(inputs[hw])
            calls.append(time.perf_counter() - start)
            compiles += shape in engine.compiled_shapes and shape not in known
        result[strategy] = dict(build_s=round(build_s, 3), cold_total_s=round(build_s + sum(calls), 2),
                                cold_median_ms=round(1e3 * statistics.median(calls), 1),
                                cold_slowest_s=round(max(calls), 3), compiles=compiles,
                                rss_growth_mb=round(rss_mb() - before, 1))
        engines[strategy] = engine
        print(f'[shapes] cold {strategy}: {result[strategy]}', flush=True)
    warm: dict[str, list[float]] = {s: [] for s in engines}
    for hw in stream:
        for strategy, engine in engines.items():
            time.sleep(args.settle)
            start = time.perf_counter()
            engine(inputs[hw])
            warm[strategy].append(time.perf_counter() - start)
    for strategy, times in warm.items():
        result[strategy].update(warm_median_ms=round(1e3 * statistics.median(times), 1),
                                warm_total_s=round(sum(times), 2),
                                compiled_shapes=len(engines[strategy].compiled_shapes))
        if len(inputs) <= 8:  # a few recurring sizes: the median of each
            result[strategy]['warm_median_ms_by_size'] = {
                f'{h}x{w}': round(1e3 * statistics.median(t for t, size in zip(times, stream, strict=False)
                                                          if size == (h, w)), 1)
                for h, w in sorted(inputs)}
    return result


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('name', nargs='?', default='pcpvt_small')
    p.add_argument('--sizes', nargs='*', default=[], help='the mixed stream: HxW items or a folder of images')
    p.add_argument('--stream', type=int, default=150, help='images in the mixed stream')
    p.add_argument('--recurring', nargs='*', default=['480x640', '800x1216'], help='the recurring stream: HxW')
    p.add_argument('--recurring-calls', type=int, default=200, help='images in the recurring stream')
    p.add_argument('--cache-size', type=int, default=8)
    p.add_argument('--specialise-after', type=int, default=64)
    p.add_argument('--precision', choices=('fp32', 'bf16'), default='fp32')
    p.add_argument('--settle', type=float, default=0.05)
    p.add_argument('--json')
    args = p.parse_args()
    sizes = stream_sizes(args.sizes)
    streams = {'mixed': [sizes[i % len(sizes)] for i in range(args.stream)]}
    if args.recurring:
        recurring = stream_sizes(args.recurring)
        streams['recurring'] = [recurring[i % len(recurring)] for i in range(args.recurring_calls)]
    info = cpu_info()
    print(f'[shapes] {info["cpu"]}, ISA {info["isa"]}, flags {info["flags"]}, {torch.get_num_threads()} threads; '
          f'{args.name} {args.precision}; ' + ', '.join(f'{k}: {len(v)} images of {len(set(v))} sizes'
                                                          for k, v in streams.items()), flush=True)
    torch.manual_seed(0)
    model = create_model(args.name, features_only=True).eval()
    with tempfile.TemporaryDirectory(prefix='openvino_shapes-') as folder:
        cache = str(Path(folder) / args.name)
        start = time.perf_counter()
        prepare(model, 'openvino', args.precision, cache=cache)
        convert_s = time.perf_counter() - start
        result = dict(cpu=info, name=args.name, precision=args.precision, threads=torch.get_num_threads(),
                      cache_size=args.cache_size, specialise_after=args.specialise_after,
                      command=' '.join(['python', '-m', 'benchmarks.openvino_shapes'] + sys.argv[1:]),
                      convert_s=round(convert_s, 2), streams={})
        for key, stream in streams.items():
            result['streams'][key] = dict(images=len(stream), distinct_sizes=len(set(stream)),
                                          strategies=run_stream(model, cache, stream, args))
    result['peak_rss_mb'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(result['streams'], indent=1))
    print(f'[shapes] conversion {convert_s:.1f} s; peak RSS {result["peak_rss_mb"]:.0f} MB')
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == '__main__':
    main()
