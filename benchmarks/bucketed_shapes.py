"""Any size at compiled speed? A stream of random sizes through OpenVINO's shape strategies, bucketed shapes and
the fused engine, one image at a time and in batches of mixed sizes.

    python -m benchmarks.bucketed_shapes [NAME] [--images 200] [--sides 64 1024] [--bucket 128]
        [--bucket-cache 16] [--batch-size 8] [--rounds 2] [--seed 0] [--json PATH]

The stream: ``--images`` sizes, each side drawn uniformly from ``--sides`` (seed ``--seed``), one random image of
each; the backbone ``NAME`` (random weights) as a feature pyramid. Ways (``prepare``, one float32 conversion
read from a temporary cache by every OpenVINO way, one with valid sizes by the bucketed ones):

* ``openvino dynamic``, ``openvino auto`` (its defaults: a size compiled at its 64th call);
* ``openvino per shape``: a model compiled for every size met (``shapes='static'``, cache as large as the
  stream): its warm pass is the limit, each image on a model compiled for its own size;
* ``openvino bucketed``: inputs padded to multiples of ``--bucket`` and run with their valid sizes, a model
  compiled per bucket and ``--bucket-cache`` kept (``bucket=``, ``shapes='static'``); ``... batch N``: the
  stream through ``run_images`` in batches of ``--batch-size`` images of similar size, each batch padded to its
  bucket;
* ``fused`` (eager: no compile, so it is its own per-shape limit), ``fused bucketed``, ``fused batch N`` (the
  fused engine takes valid sizes itself).

Cold pass: each way alone from a fresh engine over the whole stream (its time includes every compile; the peak
resident memory above the start of the pass, ``/proc/self/status`` VmHWM reset through ``clear_refs``; the
memory it keeps afterwards). Warm pass: ``--rounds`` rounds, each running every way over the whole stream, the
order rotated each round; the median round's images/s. Every way's outputs are checked against the fused
engine's (the model to float32 rounding) at each image's own size: the largest relative L2 is reported. The CPU's
ISA is printed with the figures. Nothing else should run meanwhile.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from cpvt_backbones import create_model, prepare, run_images
from cpvt_backbones.utils import cpu_info


def rss_mb(field: str = 'VmRSS') -> float:
    """This process's resident memory (``VmRSS``) or its peak since the last ``reset_peak`` (``VmHWM``), MB."""
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith(field + ':'):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f'no {field} in /proc/self/status')


def reset_peak() -> None:
    Path('/proc/self/clear_refs').write_text('5')


def stream(count: int, sides: tuple[int, int], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hw = torch.randint(sides[0], sides[1] + 1, (count, 2), generator=generator).tolist()
    return [torch.randn(3, h, w, generator=generator) for h, w in hw]


def runner(engine, batch_size: int | None):
    """The stream through ``engine``: one image at a time, or ``run_images`` in batches of ``batch_size``."""
    if batch_size:
        return lambda images: run_images(engine, images, batch_size=batch_size)
    return lambda images: [tuple(m[0] for m in engine(image[None])) for image in images]


def compiled(engine) -> int:
    inner = getattr(engine, 'module', engine)
    return len(getattr(inner, 'compiled_shapes', ()))


def largest_error(outputs, reference) -> float:
    return max(float((o - r).norm() / r.norm()) for out, ref in zip(outputs, reference, strict=True)
               for o, r in zip(out, ref, strict=True))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('name', nargs='?', default='pcpvt_small')
    p.add_argument('--images', type=int, default=200)
    p.add_argument('--sides', type=int, nargs=2, default=(64, 1024))
    p.add_argument('--bucket', type=int, default=128)
    p.add_argument('--bucket-cache', type=int, default=16)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json')
    args = p.parse_args(argv)
    info = cpu_info()
    images = stream(args.images, tuple(args.sides), args.seed)
    print(f'[buckets] {info["cpu"]}, ISA {info["isa"]}, flags {info["flags"]}, {torch.get_num_threads()} threads; '
          f'{args.name}; {len(images)} images, sides {args.sides[0]}-{args.sides[1]} px', flush=True)
    torch.manual_seed(0)
    model = create_model(args.name, features_only=True).eval()
    n = args.batch_size
    with tempfile.TemporaryDirectory(prefix='bucketed_shapes-') as folder:
        cache = str(Path(folder) / args.name)
        start = time.perf_counter()
        prepare(model, 'openvino', cache=cache)
        prepare(model, 'openvino', cache=cache, bucket=args.bucket)
        convert_s = time.perf_counter() - start
        bucketed = dict(bucket=args.bucket, shapes='static', cache_size=args.bucket_cache, cache=cache)
        ways = {   # name: (the engine, made when its cold pass starts; batch size or None: one at a time)
            'fused': (lambda: prepare(model, 'fused'), None),
            'fused bucketed': (lambda: prepare(model, 'fused', bucket=args.bucket), None),
            f'fused batch {n}': (lambda: prepare(model, 'fused'), n),
            'openvino dynamic': (lambda: prepare(model, 'openvino', shapes='dynamic', cache=cache), None),
            'openvino auto': (lambda: prepare(model, 'openvino', cache=cache), None),
            'openvino per shape': (lambda: prepare(model, 'openvino', shapes='static', cache_size=len(images),
                                                   cache=cache), None),
            'openvino bucketed': (lambda: prepare(model, 'openvino', **bucketed), None),
            f'openvino bucketed batch {n}': (lambda: prepare(model, 'openvino', **bucketed), n),
        }
        with torch.no_grad():   # the process's first call (thread pools, allocator) is nobody's cold pass
            model(images[0][None])
        runs, result, reference = {}, {}, None
        for way, (build, batch_size) in ways.items():
            before = rss_mb()
            reset_peak()
            start = time.perf_counter()
            engine = build()
            run = runner(engine, batch_size)
            with torch.no_grad():
                outputs = run(images)
            seconds = time.perf_counter() - start
            reference = outputs if reference is None else reference
            result[way] = dict(cold_s=round(seconds, 1), cold_images_per_s=round(len(images) / seconds, 2),
                               compiled=compiled(engine), peak_mb=round(rss_mb('VmHWM') - before),
                               kept_mb=round(rss_mb() - before), max_error=largest_error(outputs, reference))
            runs[way] = run
            print(f'[buckets] cold {way}: {result[way]}', flush=True)
        order = list(runs)
        rounds = {way: [] for way in runs}
        for r in range(args.rounds):
            for way in order[r % len(order):] + order[:r % len(order)]:
                start = time.perf_counter()
                with torch.no_grad():
                    runs[way](images)
                rounds[way].append(time.perf_counter() - start)
        for way, times in rounds.items():
            result[way].update(warm_s=round(statistics.median(times), 1),
                               warm_images_per_s=round(len(images) / statistics.median(times), 2))
            print(f'[buckets] warm {way}: {result[way]}', flush=True)
    out = dict(cpu=info, name=args.name, images=len(images), sides=list(args.sides), bucket=args.bucket,
               bucket_cache=args.bucket_cache, batch_size=n, rounds=args.rounds, seed=args.seed,
               threads=torch.get_num_threads(), convert_s=round(convert_s, 1), ways=result,
               command=' '.join(['python', '-m', 'benchmarks.bucketed_shapes'] + (sys.argv[1:] if argv is None
                                                                                 else list(argv))))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + '\n')
    return out


if __name__ == '__main__':
    main()
