"""Resolution with real detail by construction: shapes drawn natively at every test size.

    python -m benchmarks.native_detail [--variants learned peg_0-5 none cnn] [--seeds 0 1 2 3 4] [--shard K/N]
        [--train-images 12000] [--test-images 2000] [--device cpu|cuda] [--tf32 off] [--jobs N] [--work-dir DIR]
        [--out DIR]

The classification task: which of four shapes (circle, square, triangle, star) a scene shows, 2-4 of one class
at random positions, sizes and rotations on a textured background (``cpvt_backbones.datasets.class_scenes``).
Every image is drawn from its resolution-free scene at the size it is used at, so a larger test image carries
real extra detail (crisper edges of smaller shapes), as ImageNet's 384 px tests of a 224 px model do.

Every drawing is rendered at twice its size and shrunk (antialiased, ``draw``). Training: the scenes drawn at 112
px (2x, the "originals"), DeiT-like random resized crops (area 0.25-1, aspect 3/4-4/3, flips, antialiased) to 56
px, patch 4: a 14 x 14 token grid, 8 epochs; the resolution study's models, optimiser and trainer
(``benchmarks.study``'s default ``StudyConfig`` with the fields below replaced) with global average pooling.
Tests: held-out scenes drawn natively at 56, 80, 96 (1.71x: the paper's 384 / 224) and 112 px, and the 56 px
drawings upsampled to 96 px (the same size without the detail). The variants: the learned table (resized), PEGs
after blocks 0-5, no position encoding and the CNN without position encoding (the positive control: the FixRes
effect, if this setting can show one at all). Seeds are fixed in advance (0-4).

Resumable and sharded like the resolution study (runs under WORK_DIR/native_detail/VARIANT-seedS, result.json
kept in git); the outputs (NAME.{json,csv,md,png}) are written by whichever invocation finds every run finished:
per variant the top-1 at each test and its change from the training size, and paired by seed the differences between the
variants, each with its 95% interval; a difference is claimed only where the interval excludes zero.
"""
import argparse
import json
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path
from collections.abc import Sequence

import numpy as np
import torch

from cpvt_backbones.datasets import class_scenes, render
from cpvt_backbones.utils import atomic_write, pyplot
from benchmarks.study.common import format_paired, mean_std, paired, parse_shard, run_meta, write_csv
from benchmarks.study.config import TF32, VARIANTS, StudyConfig
from benchmarks.study.data import resize
from benchmarks.study.report import line_style, trained_on
from benchmarks.study.specs import Resized
from benchmarks.study.trainer import build_model, evaluate, train

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SIZE, ORIGINAL_SIZE = 56, 112            # training crops and the training drawings they are cut from (px)
PATCH = 4                                     # a 14 x 14 token grid at the training size
TEST_SIZES = (56, 80, 96, 112)
UPSAMPLED = 96                                # the 56 px drawings resized to this size: size without detail
OBJECTS, OBJECT_SIZE = (2, 4), (0.12, 0.3)    # shapes per scene; radius as a fraction of half the side
TRAIN_SEED, TEST_SEED = 0, 1                  # the scene sets' seeds (the training seeds are --seeds)
MEAN, STD = 0.5, 0.25                         # fixed pixel normalisation (images scaled to 0..1)
DRAW_CHUNK = 256                              # scenes rendered at once
STUDIED = ('learned', 'peg_0-5', 'none', 'cnn')
PAIRS = (('peg_0-5', 'learned'), ('peg_0-5', 'none'), ('learned', 'none'), ('peg_0-5', 'cnn'), ('learned', 'cnn'),
         ('none', 'cnn'))


def test_keys() -> list[str]:
    """'native96': held-out scenes drawn at 96 px; 'upsampled96': their 56 px drawings resized to 96 px."""
    return [f'native{s}' for s in TEST_SIZES] + [f'upsampled{UPSAMPLED}']


def parse_args(argv: Sequence[str] | None = None) -> tuple[StudyConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--variants', nargs='+', default=list(STUDIED), choices=list(VARIANTS))
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
    p.add_argument('--shard', default='0/1', help='K/N: run every N-th (variant, seed) from the K-th (0-based)')
    p.add_argument('--train-images', type=int, default=12000)
    p.add_argument('--test-images', type=int, default=2000)
    p.add_argument('--epochs', type=int, default=8)
    p.add_argument('--device', default='cpu', help='torch device to train and test on (one per comparison)')
    p.add_argument('--tf32', choices=TF32, default='off',
                   help='TF32 on a CUDA device (resolution_study --tf32); off: full float32, as on a CPU')
    p.add_argument('--jobs', type=int, default=1,
                   help='processes: the drawing is spread over them, then as many runs train at once, sharing '
                        'the drawn images through one memory-mapped file')
    p.add_argument('--threads', type=int, default=1, help='torch threads per run when --jobs > 1')
    p.add_argument('--work-dir', type=Path, default=ROOT / 'benchmarks/results/recipe_runs',
                   help='runs go to WORK_DIR/NAME/')
    p.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results')
    p.add_argument('--name', default='native_detail')
    args = p.parse_args(argv)
    shard_index, num_shards = parse_shard(p, args.shard)
    if args.train_images < 128 or args.test_images < 1:
        p.error('need --train-images >= 128 (one batch) and --test-images >= 1')
    if args.jobs < 1 or args.threads < 1:
        p.error(f'--jobs and --threads must be >= 1, got {args.jobs} and {args.threads}')
    config = StudyConfig().replace(
        variants=tuple(args.variants), seeds=tuple(args.seeds), shard_index=shard_index, num_shards=num_shards,
        train_images=args.train_images, test_images=args.test_images, epochs=args.epochs, device=args.device,
        tf32=args.tf32, work_dir=args.work_dir, out=args.out, name=args.name, head='gap', image_size=TRAIN_SIZE,
        patch=PATCH, test_sizes=TEST_SIZES, probe_images=0, in_chans=3, num_classes=4)
    return config, args


def _render(scenes, scale: float) -> np.ndarray:
    return np.stack([render(scene, scale)[0] for scene in scenes])


def draw(scenes, side: int, size: int, pool: Executor | None = None) -> torch.Tensor:
    """The scenes (``side`` px at scale 1) drawn natively at ``size`` px, normalised, (N, 3, size, size):
    rendered at twice the size and shrunk (antialiased), as a camera's pixels average the scene, so that edges
    and pixel noise look alike at every size and alike in training crops (themselves shrunk from their
    drawings) and in tests. Rendered in chunks (the 2x renders of a whole set would not fit in memory), spread
    over ``pool``'s processes where one is given."""
    chunks = [scenes[start:start + DRAW_CHUNK] for start in range(0, len(scenes), DRAW_CHUNK)]
    rendered = (pool.map if pool else map)(_render, chunks, [2 * size / side] * len(chunks))
    return torch.cat([resize((torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255 - MEAN) / STD,
                                size).contiguous() for images in rendered])


def load_data(config: StudyConfig, pool: Executor | None = None):
    """(training drawings at ORIGINAL_SIZE, labels), and per test key (images, labels)."""
    scenes, labels = class_scenes(config.train_images, ORIGINAL_SIZE, TRAIN_SEED, OBJECTS, OBJECT_SIZE)
    train = draw(scenes, ORIGINAL_SIZE, ORIGINAL_SIZE, pool), torch.from_numpy(labels)
    scenes, labels = class_scenes(config.test_images, ORIGINAL_SIZE, TEST_SEED, OBJECTS, OBJECT_SIZE)
    y = torch.from_numpy(labels)
    tests = {f'native{s}': (draw(scenes, ORIGINAL_SIZE, s, pool), y) for s in TEST_SIZES}
    tests[f'upsampled{UPSAMPLED}'] = (resize(tests[f'native{TRAIN_SIZE}'][0], UPSAMPLED), y)
    return train, tests


def run(variant: str, seed: int, config: StudyConfig, data) -> dict:
    """One (variant, seed): trained once (resumable), then tested on every test key its result lacks."""
    run_dir = config.run_dir(variant, seed)
    result_path = run_dir / 'result.json'
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    model = None
    if result is None or (not (run_dir / 'final.pth').is_file() and set(test_keys()) - set(result['top1'])):
        run_dir.mkdir(parents=True, exist_ok=True)
        model, result = train(variant, seed, config, data[0], run_dir)
    missing = [k for k in test_keys() if k not in result['top1']]
    if missing:
        if model is None:
            model = build_model(variant, config)
            model.load_state_dict(torch.load(run_dir / 'final.pth', map_location='cpu'))
            model.to(config.device)
        start = time.perf_counter()
        for key in missing:   # each test's images are already at their size: evaluate's resize is the identity
            x, y = data[1][key]
            result['top1'][key] = evaluate(model, x, y, [Resized(x.shape[-1])], config)[str(x.shape[-1])]
        result['eval_seconds'] = round(result['eval_seconds'] + time.perf_counter() - start, 1)
        print(f'[native] {variant} seed {seed}: ' + ', '.join(f'{k} {result["top1"][k]:.2f}' for k in missing),
              flush=True)
        atomic_write(result_path, json.dumps(result, indent=2).encode())
    return result


def summarise(results: list[dict], config: StudyConfig) -> dict:
    """Per variant and test: top-1 mean ± sd and the paired change from the training size; per pair of variants
    and test: the paired difference in top-1 and in the change from the training size (each with its 95%
    interval)."""
    by_variant = {v: sorted((r for r in results if r['variant'] == v), key=lambda r: r['seed'])
                  for v in config.variants}
    base = f'native{TRAIN_SIZE}'
    rows, pairs = [], []
    for variant, runs in by_variant.items():
        for key in test_keys():
            acc = [r['top1'][key] for r in runs]
            m, s = mean_std(acc)
            row = dict(variant=variant, test=key, top1_mean=m, top1_std=s, top1_per_seed=[round(a, 2) for a in acc],
                       seeds=[r['seed'] for r in runs])
            if key != base:
                row['change'] = paired(acc, [r['top1'][base] for r in runs])
            rows.append(row)
    for a, b in PAIRS:
        if a not in by_variant or b not in by_variant:
            continue
        for key in test_keys():
            top_a = [r['top1'][key] for r in by_variant[a]]
            top_b = [r['top1'][key] for r in by_variant[b]]
            entry = dict(a=a, b=b, test=key, top1=paired(top_a, top_b))
            if key != base:
                entry['change'] = paired([x - r['top1'][base] for x, r in zip(top_a, by_variant[a], strict=True)],
                                         [x - r['top1'][base] for x, r in zip(top_b, by_variant[b], strict=True)])
            pairs.append(entry)
    return dict(rows=rows, pairs=pairs)


def heading(key: str) -> str:
    size = int(key.removeprefix('native').removeprefix('upsampled'))
    kind = 'drawn' if key.startswith('native') else f'{TRAIN_SIZE} px drawing resized to'
    return f'{kind} {size} px ({size / TRAIN_SIZE:.2g}x)'


def render_markdown(summary: dict, config: StudyConfig, meta: dict) -> str:
    keys = test_keys()
    lines = ['| model | ' + ' | '.join(heading(k) for k in keys) + ' |', '|---|' + '---|' * len(keys)]
    for variant in config.variants:
        cells = []
        for row in (r for r in summary['rows'] if r['variant'] == variant):
            cell = f'{row["top1_mean"]:.2f} ± {row["top1_std"]:.2f}'
            if 'change' in row:
                cell += f' ({format_paired(row["change"])})'
            cells.append(cell)
        lines.append(f'| {VARIANTS[variant].label} | ' + ' | '.join(cells) + ' |')
    lines += ['', f'Paired by seed, A − B: the difference in the change from {TRAIN_SIZE} px (in top-1 at '
              f'{TRAIN_SIZE} px for the first column), mean [95% interval]; `=`: the interval includes zero (tied).',
              '',
              '| A − B | ' + ' | '.join(f'top-1 at {TRAIN_SIZE} px' if k == f'native{TRAIN_SIZE}' else
                                       f'change to {heading(k)}' for k in keys) + ' |',
              '|---|' + '---|' * len(keys)]
    for a, b in PAIRS:
        entries = [p for p in summary['pairs'] if (p['a'], p['b']) == (a, b)]
        if entries:
            lines.append(f'| {a} − {b} | ' + ' | '.join(
                (lambda d: f'{format_paired(d)}{" =" if d["sign"] == "=" else ""}')(p.get('change', p['top1']))
                for p in entries) + ' |')
    return '\n'.join(lines) + (
        f'\n\nTop-1 (%) on {config.test_images} held-out scenes, mean ± standard deviation over seeds '
        f'{list(config.seeds)} (in brackets: the change from {TRAIN_SIZE} px, paired by seed, with its 95% '
        f'interval). Trained on {config.train_images} scenes drawn at {ORIGINAL_SIZE} px, random resized crops '
        f'(area {config.crop_scale}-1) to {TRAIN_SIZE} px, patch {config.patch} ({TRAIN_SIZE // config.patch} x '
        f'{TRAIN_SIZE // config.patch} tokens), global average pooling, {config.dim} wide, depth {config.depth}, '
        f'{config.epochs} epochs ({meta["iterations"]} iterations) on {meta["trained_on"]}. Parameters: '
        f'{meta["params"]}. Run time summed over the runs: {meta["run_minutes"]} min; this invocation: '
        f'{meta["wall_minutes"]} min.\n\n`{meta["command"]}`\n')


def plot(summary: dict, config: StudyConfig, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    for variant in config.variants:
        rows = [r for r in summary['rows'] if r['variant'] == variant and r['test'].startswith('native')]
        sizes = [int(r['test'].removeprefix('native')) for r in rows]
        change = [0.] + [r['change']['mean'] for r in rows[1:]]
        lo = [0.] + [r['change']['mean'] - (r['change']['lo'] if r['change']['lo'] is not None else r['change']['mean'])
                     for r in rows[1:]]
        ax.errorbar(sizes, change, yerr=lo, capsize=3, label=VARIANTS[variant].label,
                    **line_style(variant, plt))
    ax.axhline(0, color='grey', lw=0.8)
    ax.set_xlabel(f'test size (px), drawn natively; trained at {TRAIN_SIZE} px')
    ax.set_ylabel(f'change in top-1 from {TRAIN_SIZE} px (points, 95% interval)')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_SHARED: dict = {}


def _load_shared(path: Path, threads: int) -> None:
    torch.set_num_threads(threads)
    _SHARED['data'] = torch.load(str(path), mmap=True)   # torch 2.1 takes mmap only with a str


def _run_shared(variant: str, seed: int, config: StudyConfig) -> str:
    run(variant, seed, config, _SHARED['data'])
    return f'{variant}-seed{seed}'


def main(argv: Sequence[str] | None = None) -> dict:
    config, args = parse_args(argv)
    start = time.perf_counter()
    context = get_context('spawn')
    with ProcessPoolExecutor(args.jobs, mp_context=context) if args.jobs > 1 else nullcontext() as pool:
        data = load_data(config, pool)
    runs = [(v, seed) for seed in config.seeds for v in config.variants]
    mine = runs[config.shard_index::config.num_shards]
    if args.jobs > 1 and mine:
        with tempfile.TemporaryDirectory(prefix='native_detail-') as tmp:
            path = Path(tmp) / 'drawn.pt'
            torch.save(data, path)
            with ProcessPoolExecutor(args.jobs, mp_context=context, initializer=_load_shared,
                                     initargs=(path, args.threads)) as pool:
                for done in pool.map(_run_shared, *zip(*mine, strict=True), [config] * len(mine)):
                    print(f'[native] {done} finished', flush=True)
    for variant, seed in mine:   # with --jobs > 1: every run is finished, result.json is read
        run(variant, seed, config, data)
    pending = [f'{v}-seed{s}' for v, s in runs if not (config.run_dir(v, s) / 'result.json').is_file()]
    if pending:
        print(f'[native] this shard is done; {len(pending)} run(s) of other shards pending: {", ".join(pending)}')
        return {}
    results = [run(v, seed, config, data) for v, seed in runs]
    summary = summarise(results, config)
    meta = dict(run_meta('benchmarks.native_detail', argv, start), train_images=config.train_images,
                test_images=config.test_images, seeds=list(config.seeds), epochs=config.epochs,
                iterations=results[0]['iterations'], device=config.device, tf32=config.tf32,
                trained_on=trained_on(results),
                params={r['variant']: r['params'] for r in results},
                run_minutes=round(sum(r['train_seconds'] + r['eval_seconds'] for r in results) / 60, 1))
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv([dict(r, change=format_paired(r['change']) if 'change' in r else '') for r in summary['rows']],
              out / f'{config.name}.csv')
    (out / f'{config.name}.json').write_text(json.dumps(dict(meta=meta, **summary, runs=results), indent=2))
    (out / f'{config.name}.md').write_text(render_markdown(summary, config, meta))
    plot(summary, config, out / f'{config.name}.png')
    print(f'[native] {meta["wall_minutes"]} min; results in {out}')
    return summary


if __name__ == '__main__':
    main()
