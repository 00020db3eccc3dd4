"""OpenVINO's dynamic shapes against a cache of shape-specialised compiled models, on a stream of mixed sizes.

    python -m benchmarks.openvino_shapes [NAME] [--sizes data/shapes/val/images | --sizes 480x640 ...]
        [--stream 60] [--precision fp32|bf16] [--json PATH]

One ``OpenVINOModule`` per strategy (``deploy.openvino``): ``shapes='dynamic'`` (one compiled model) and
``shapes='static'`` (a model compiled per new input shape, cached), both from the same conversion of the
backbone ``NAME`` (random weights). The stream is ``--stream`` images at batch 1 whose sizes cycle through the
given list (by default the native sizes of the demo's held-out scenes, ``data/shapes/val/images``, or a fixed
list of eight sizes when those are absent). First each strategy alone meets every distinct size once: its first
call per size (the static cache compiles there) and the growth of the process's resident memory. Then both run
the stream image by image, interleaved in one process after ``--settle`` seconds of idle time each: the median
and total per-image time. The CPU's vector ISA is printed with the figures.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from cpvt_backbones import create_model
from cpvt_backbones.deploy.openvino import OpenVINOModule, convert
from benchmarks.timing import cpu_info

ROOT = Path(__file__).resolve().parents[1]
FALLBACK_SIZES = ((480, 640), (512, 512), (384, 683), (600, 800), (256, 1024), (333, 500), (720, 540), (224, 224))


def rss_mb() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2 ** 20


def stream_sizes(spec: List[str]) -> List[Tuple[int, int]]:
    """Sizes (h, w) from 'HxW' items or from the images of a folder (their native sizes, in file order)."""
    if len(spec) == 1 and Path(spec[0]).is_dir():
        from PIL import Image
        files = sorted(p for p in Path(spec[0]).iterdir() if p.suffix.lower() in ('.png', '.jpg', '.jpeg'))
        return [Image.open(p).size[::-1] for p in files]
    if spec:
        return [tuple(int(v) for v in s.lower().split('x')) for s in spec]
    folder = ROOT / 'data/shapes/val/images'
    return stream_sizes([str(folder)]) if folder.is_dir() else list(FALLBACK_SIZES)


def main() -> Dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('name', nargs='?', default='pcpvt_small')
    p.add_argument('--sizes', nargs='*', default=[])
    p.add_argument('--stream', type=int, default=60, help='images in the stream')
    p.add_argument('--precision', choices=('fp32', 'bf16'), default='fp32')
    p.add_argument('--settle', type=float, default=0.05)
    p.add_argument('--json')
    args = p.parse_args()
    sizes = stream_sizes(args.sizes)
    distinct = sorted(set(sizes))
    stream = [sizes[i % len(sizes)] for i in range(max(args.stream, len(distinct)))]
    info = cpu_info()
    print(f'[shapes] {info["cpu"]}, ISA {info["isa"]}, flags {info["flags"]}, {torch.get_num_threads()} threads; '
          f'{args.name} {args.precision}, {len(stream)} images of {len(distinct)} sizes')
    torch.manual_seed(0)
    model = create_model(args.name, features_only=True).eval()
    start = time.perf_counter()
    ov_model, spec = convert(model, torch.randn(2, 3, 224, 224))
    convert_s = time.perf_counter() - start
    base_rss = rss_mb()
    engines, compile_s = {}, {}
    for strategy in ('dynamic', 'static'):
        start = time.perf_counter()
        engines[strategy] = OpenVINOModule(ov_model, spec, 3, args.precision, strategy, cache_size=len(distinct))
        compile_s[strategy] = time.perf_counter() - start
    inputs = {hw: torch.randn(1, 3, *hw) for hw in distinct}
    first: Dict[str, Dict] = {s: {} for s in engines}
    rss: Dict[str, float] = {}
    for strategy, engine in engines.items():  # each alone through every size: first calls and memory
        before = rss_mb()
        for hw in distinct:
            time.sleep(args.settle)
            start = time.perf_counter()
            engine(inputs[hw])
            first[strategy][hw] = time.perf_counter() - start
        rss[strategy] = rss_mb() - before
    steady: Dict[str, List[float]] = {s: [] for s in engines}
    for hw in stream:  # then interleaved, image by image
        for strategy, engine in engines.items():
            time.sleep(args.settle)
            start = time.perf_counter()
            engine(inputs[hw])
            steady[strategy].append(time.perf_counter() - start)
    result = dict(cpu=info, name=args.name, precision=args.precision, threads=torch.get_num_threads(),
                  sizes=[list(s) for s in distinct], stream=len(stream), command=' '.join(
                      ['python', '-m', 'benchmarks.openvino_shapes'] + sys.argv[1:]), convert_s=round(convert_s, 2),
                  rss_after_convert_mb=round(base_rss, 1), strategies={})
    for strategy in engines:
        result['strategies'][strategy] = dict(
            compile_s=round(compile_s[strategy], 3),
            first_call_ms={f'{h}x{w}': round(1e3 * t, 1) for (h, w), t in first[strategy].items()},
            first_calls_total_s=round(sum(first[strategy].values()), 2),
            steady_median_ms=round(1e3 * statistics.median(steady[strategy]), 1) if steady[strategy] else None,
            steady_total_s=round(sum(steady[strategy]), 2), steady_calls=len(steady[strategy]),
            rss_growth_mb=round(rss[strategy], 1))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result['peak_rss_mb'] = round(peak, 1)
    print(json.dumps(result['strategies'], indent=1))
    print(f'[shapes] conversion {convert_s:.1f} s; peak RSS {peak:.0f} MB')
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == '__main__':
    main()
