"""Any size at compiled speed? A stream of random sizes through OpenVINO's shape strategies, bucketed shapes and
the fused engine, one image at a time and in batches of mixed sizes.

    python -m benchmarks.bucketed_shapes [NAME] [--images 200] [--sides 64 1024] [--bucket 128]
        [--bucket-cache 16] [--batch-size 8] [--order arrival|sorted] [--ways WAY ...] [--seed 0] [--json PATH]

The stream: ``--images`` sizes, each side drawn uniformly from ``--sides`` (seed ``--seed``), one random image of
each, in groups of ``--batch-size``: in the order drawn (``arrival``: a server's requests) or sorted by height
and width first (``sorted``: a folder of images, as ``run_images`` orders them); the backbone ``NAME`` (random
weights) as a feature pyramid. Ways (``prepare``, one float32 conversion read from a temporary cache by every
OpenVINO way, one with valid sizes by the bucketed ones):

* ``openvino dynamic``, ``openvino auto`` (its defaults: a size compiled at its 64th call);
* ``openvino per shape``: a model compiled for each image's size before it runs (``shapes='static'``, one kept:
  200 compiled models would not fit in memory): its time without the compiles is the limit, each image on a
  model compiled for its own size (timed in the cold pass only: its warm pass would compile again);
* ``openvino bucketed``: inputs padded to multiples of ``--bucket`` and run with their valid sizes, a model
  compiled per bucket and ``--bucket-cache`` kept (``bucket=``, ``shapes='static'``); ``... batch N``: each group
  through ``run_images`` as one batch, padded to its bucket;
* ``fused`` (eager: no compile, so it is its own per-shape limit), ``fused bucketed``, ``fused batch N`` (the
  fused engine takes valid sizes itself).

Cold pass: each way alone from a fresh engine over the whole stream (its time includes every compile; the peak
resident memory above the start of the pass, ``/proc/self/status`` VmHWM reset through ``clear_refs``; the
memory it keeps afterwards; outputs are compared group by group and dropped, so neither holds them). Warm pass:
the stream again, every way on each group in turn (the order rotated from group to group); each way's images/s
over the stream. Every way's outputs are checked against the torch engine's (the model as it is) at each image's
own size (computed first, untimed): the largest relative L2 is reported. The CPU's ISA is printed with the
figures. Nothing else should run meanwhile. ``--ways``: only the ways named (all by default).
"""
import argparse
import json
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


def runner(engine, batch_size: int | None, compiles: list[float] | None = None):
    """The stream through ``engine``: one image at a time, or ``run_images`` in batches of ``batch_size``; with
    ``compiles``, each image's shape compiled first (``compiled_for``), the seconds appended there."""
    if batch_size:
        return lambda images: run_images(engine, images, batch_size=batch_size)

    def run(images):
        outputs = []
        for image in images:
            if compiles is not None:
                start = time.perf_counter()
                engine.compiled_for((1, *image.shape))
                compiles.append(time.perf_counter() - start)
            outputs.append(tuple(m[0] for m in engine(image[None])))
        return outputs
    return run


def compiled(engine) -> int:
    inner = getattr(engine, 'module', engine)
    return len(getattr(inner, 'compiled_shapes', ()))


def largest_error(outputs, reference) -> float:
    return max(float((o - r).norm() / r.norm()) for out, ref in zip(outputs, reference, strict=True)
               for o, r in zip(out, ref, strict=True))


def cold_pass(run, groups, reference) -> tuple[float, float]:
    """Seconds for ``run`` over ``groups`` and the largest relative L2 against ``reference`` (one list per group),
    each group's outputs dropped once compared."""
    seconds, error = 0., 0.
    for group, expected in zip(groups, reference, strict=True):
        start = time.perf_counter()
        with torch.no_grad():
            outputs = run(group)
        seconds += time.perf_counter() - start
        error = max(error, largest_error(outputs, expected))
    return seconds, error


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('name', nargs='?', default='pcpvt_small')
    p.add_argument('--images', type=int, default=200)
    p.add_argument('--sides', type=int, nargs=2, default=(64, 1024))
    p.add_argument('--bucket', type=int, default=128)
    p.add_argument('--bucket-cache', type=int, default=16)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--order', choices=('arrival', 'sorted'), default='arrival')
    p.add_argument('--ways', nargs='+', help='the ways to run (names as printed; default: all)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json')
    args = p.parse_args(argv)
    info = cpu_info()
    images = stream(args.images, tuple(args.sides), args.seed)
    if args.order == 'sorted':
        images.sort(key=lambda image: tuple(image.shape[-2:]))
    print(f'[buckets] {info["cpu"]}, ISA {info["isa"]}, flags {info["flags"]}, {torch.get_num_threads()} threads; '
          f'{args.name}; {len(images)} images, sides {args.sides[0]}-{args.sides[1]} px, {args.order} order',
          flush=True)
    torch.manual_seed(0)
    model = create_model(args.name, features_only=True).eval()
    n = args.batch_size
    groups = [images[i:i + n] for i in range(0, len(images), n)]
    with tempfile.TemporaryDirectory(prefix='bucketed_shapes-') as folder:
        cache = str(Path(folder) / args.name)
        start = time.perf_counter()
        prepare(model, 'openvino', cache=cache)
        prepare(model, 'openvino', cache=cache, bucket=args.bucket)
        convert_s = time.perf_counter() - start
        bucketed = dict(bucket=args.bucket, shapes='static', cache_size=args.bucket_cache, cache=cache)
        ways = {   # name: (the engine, made when its cold pass starts; batch size, None: one at a time, or
                   # 'compile': one at a time, each shape compiled first)
            'fused': (lambda: prepare(model, 'fused'), None),
            'fused bucketed': (lambda: prepare(model, 'fused', bucket=args.bucket), None),
            f'fused batch {n}': (lambda: prepare(model, 'fused'), n),
            'openvino dynamic': (lambda: prepare(model, 'openvino', shapes='dynamic', cache=cache), None),
            'openvino auto': (lambda: prepare(model, 'openvino', cache=cache), None),
            'openvino per shape': (lambda: prepare(model, 'openvino', shapes='static', cache_size=1, cache=cache),
                                   'compile'),
            'openvino bucketed': (lambda: prepare(model, 'openvino', **bucketed), None),
            f'openvino bucketed batch {n}': (lambda: prepare(model, 'openvino', **bucketed), n),
        }
        on_torch = runner(model, None)
        with torch.no_grad():   # also the process's first calls (thread pools, allocator): nobody's cold pass
            reference = [on_torch(group) for group in groups]
        unknown = set(args.ways or ()) - set(ways)
        if unknown:
            p.error(f'--ways: no way named {sorted(unknown)}; the ways: {list(ways)}')
        ways = {name: way for name, way in ways.items() if not args.ways or name in args.ways}
        runs, result = {}, {}
        for way, (build, batch_size) in ways.items():
            before = rss_mb()
            reset_peak()
            start = time.perf_counter()
            engine = build()
            built = time.perf_counter() - start
            compiles = [] if batch_size == 'compile' else None
            run = runner(engine, None if batch_size == 'compile' else batch_size, compiles)
            seconds, error = cold_pass(run, groups, reference)
            seconds += built
            result[way] = dict(cold_s=round(seconds, 1), cold_images_per_s=round(len(images) / seconds, 2),
                               compiled=compiled(engine), peak_mb=round(rss_mb('VmHWM') - before),
                               kept_mb=round(rss_mb() - before), max_error=error)
            if compiles is None:
                runs[way] = run
            else:   # the limit: each image on a model compiled for its size, the compiles left out
                result[way].update(compiles=len(compiles), compile_s=round(sum(compiles), 1),
                                   limit_images_per_s=round(len(images) / (seconds - built - sum(compiles)), 2))
            print(f'[buckets] cold {way}: {result[way]}', flush=True)
        order, warm = list(runs), dict.fromkeys(runs, 0.)
        for g, group in enumerate(groups):
            for way in order[g % len(order):] + order[:g % len(order)]:
                start = time.perf_counter()
                with torch.no_grad():
                    runs[way](group)
                warm[way] += time.perf_counter() - start
        for way, seconds in warm.items():
            result[way].update(warm_s=round(seconds, 1), warm_images_per_s=round(len(images) / seconds, 2))
            print(f'[buckets] warm {way}: {result[way]}', flush=True)
    out = dict(cpu=info, name=args.name, images=len(images), sides=list(args.sides), bucket=args.bucket,
               bucket_cache=args.bucket_cache, batch_size=n, order=args.order, seed=args.seed,
               threads=torch.get_num_threads(), convert_s=round(convert_s, 1), ways=result,
               command=' '.join(['python', '-m', 'benchmarks.bucketed_shapes'] + (sys.argv[1:] if argv is None
                                                                                 else list(argv))))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + '\n')
    return out


if __name__ == '__main__':
    main()
