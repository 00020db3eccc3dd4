"""The resolution verdict across training recipes: the crop protocol with global average pooling, one factor at a
time from the default recipe, five encodings, several seeds.

    python -m benchmarks.recipe_sweep [--scale small|large] [--cells ...] [--pair auto|F1+F2] [--seeds 0 1 2]
        [--max-seeds 5] [--jobs N] [--threads T] [--device cpu|cuda]

Each cell is one ``resolution_study.py`` study (its outputs under ``--out/recipe_sweep[_large]/``): the default
recipe (``DEFAULT``: antialiased crops, 64 wide with 2 heads, peak learning rate 1e-3, position encodings exempt
from weight decay, 4 epochs of 20,000 images, bilinear test resizing), each factor of ``FACTORS`` changed alone,
the 2 x 2 of two factors (``--pair auto``: the two that move the order of the encodings at 2x most), and the
class-token head at the default. A test-time factor (bicubic resizing) tests the default's saved models again.
Where the two leading encodings at 2x do not keep their order in every seed, the cell gets more seeds, one at a
time, up to ``--max-seeds``; the 2 x 2 cell runs ``--pair-seeds``.

``--scale large``: all 60,000 training images and the 10,000 test images, patch 1 at 14 px (a 14 x 14 token
grid, the paper's), 4 epochs (3x the small scale's iterations): a GPU's scale (``--device cuda``).

Runs go through a pool of ``--jobs`` processes with ``--threads`` threads each; every run is resumable
(``resolution_study``'s checkpoints), so an interrupted sweep continues where it stopped. Writes
``recipe_sweep[_large].{json,csv,md,png}`` with the verdict table: per recipe and test size the encodings in
order, the leader's lead over the second (paired by seed), and the paper's claim (a gain at 1.4x without
fine-tuning while the learned table drops) judged per recipe; where a recipe's seeds trained on more than one
device (``--device`` differs between invocations that share the runs), its verdict also per device.
"""
import argparse
import itertools
import json
import shlex
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import NamedTuple
from collections.abc import Sequence

import torch

from cpvt_backbones.utils import pyplot
from benchmarks import resolution_study as rs
from benchmarks.study_common import mean_std, run_meta, write_csv

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / 'benchmarks/results/recipe_runs'
ENCODINGS = ('none', 'learned', 'peg_0', 'peg_0-5', 'rope_mixed')
SCALES = {
    'small': ('--image-size', '14', '--patch', '2', '--train-images', '20000', '--epochs', '4',
              '--test-images', '2500', '--probe-images', '500'),
    'large': ('--image-size', '14', '--patch', '1', '--train-images', '60000', '--epochs', '4',
              '--test-images', '10000', '--probe-images', '1000'),
}
COMMON = ('--head', 'gap', '--test-sizes', '14', '20', '28', '42', '--variants') + ENCODINGS


class Recipe(NamedTuple):
    label: str
    train: tuple[str, ...]      # resolution_study options that change training
    test: tuple[str, ...] = ()  # options that change only the tests (the default's saved models are reused)


DEFAULT = Recipe('default', ())
FACTORS: dict[str, Recipe] = {
    'aliased': Recipe('aliased crops', ('--crop-resample', 'aliased')),
    'width96': Recipe('width 96, 3 heads', ('--dim', '96', '--heads', '3')),
    'lr2e-3': Recipe('peak learning rate 2e-3', ('--lr', '2e-3')),
    'decay_position': Recipe('weight decay on position parameters', ('--decay-position',)),
    'schedule3x': Recipe('3x longer schedule', ('--schedule-factor', '3')),
    'bicubic': Recipe('bicubic test resizing', (), ('--test-resample', 'bicubic')),
}
CLS = Recipe('class token head', ('--head', 'cls'))


def cell_recipe(cell: str) -> Recipe:
    """'default', a factor, 'cls', or 'F1+F2' (both factors)."""
    if cell == 'default':
        return DEFAULT
    if cell == 'cls':
        return CLS
    parts = cell.split('+')
    unknown = [p for p in parts if p not in FACTORS]
    if unknown or len(parts) != len(set(parts)):
        raise ValueError(f'unknown recipe cell {cell!r}: one of default, cls, {", ".join(FACTORS)} or F1+F2')
    recipes = [FACTORS[p] for p in parts]
    return Recipe(' + '.join(r.label for r in recipes), sum((r.train for r in recipes), ()),
                  sum((r.test for r in recipes), ()))


class Sweep(NamedTuple):
    scale: str
    device: str
    data: str
    work_dir: Path
    out: Path
    options: tuple[str, ...] = ()  # passed to every study after the scale's (a smaller test, say)

    @property
    def tag(self) -> str:
        return 'recipe_sweep' if self.scale == 'small' else f'recipe_sweep_{self.scale}'

    def argv(self, cell: str, seeds: Sequence[int]) -> list[str]:
        """The resolution_study command line of a cell; cells with the same training share their runs."""
        recipe = cell_recipe(cell)
        train_key = '+'.join(p for p in cell.split('+') if p == 'default' or p == 'cls' or FACTORS[p].train)
        args = list(SCALES[self.scale] + self.options + COMMON + recipe.test)
        train = list(recipe.train)
        if '--schedule-factor' in train:  # multiplies the epochs the scale (and --study-options) set
            i = train.index('--schedule-factor')
            factor = int(train.pop(i + 1))
            train.pop(i)
            train += ['--epochs', str(rs.parse_args(args).epochs * factor)]
        return args + train + ['--name', f'{self.tag}_{cell}', '--runs', f'{self.tag}_{train_key or "default"}',
                               '--seeds', *map(str, seeds), '--device', self.device, '--data', self.data,
                               '--work-dir',
                               str(self.work_dir), '--out', str(self.out / self.tag)]


_DATA: dict[tuple, tuple] = {}


def _train_one(config: rs.StudyConfig, variant: str, seed: int, threads: int) -> str:
    """One (cell, encoding, seed) run in a pool worker: trained (or resumed), tested, cached in result.json."""
    torch.set_num_threads(threads)
    key = (config.data, config.train_images, config.test_images)
    if key not in _DATA:
        _DATA[key] = (rs.load_split(config.data, 'train', config.train_images),
                      rs.load_split(config.data, 'test', config.test_images))
    rs.run(variant, seed, config, _DATA[key], config.run_dir(variant, seed))
    return f'{config.runs}/{variant}-seed{seed}'


def run_cells(sweep: Sweep, cells: dict[str, list[int]], jobs: int, threads: int) -> None:
    """Train every run the cells need (one per training recipe, encoding and seed) in a pool, then write each
    cell's study outputs (tests a cell adds run there, on the saved models)."""
    todo, seen = [], set()
    for cell, seeds in cells.items():
        config = rs.parse_args(sweep.argv(cell, seeds))
        for seed, variant in itertools.product(seeds, ENCODINGS):
            if (config.runs, variant, seed) not in seen:
                seen.add((config.runs, variant, seed))
                todo.append((config, variant, seed))
    if todo:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context('spawn')) as pool:
            for done in pool.map(_train_one, *zip(*todo, strict=False), [threads] * len(todo)):
                print(f'[sweep] {done} finished', flush=True)
    for cell, seeds in cells.items():
        rs.main(sweep.argv(cell, seeds))


def load_cell(sweep: Sweep, cell: str, seeds: Sequence[int]) -> dict:
    """Per encoding and test size (1x, 1.4x, 2x, 3x): top-1 per seed, from the runs' result.json."""
    config = rs.parse_args(sweep.argv(cell, seeds))
    keys = rs.size_keys(config)[:len(config.test_sizes)]
    top1, devices = {}, {s: set() for s in seeds}
    for variant in ENCODINGS:
        results = [json.loads((config.run_dir(variant, s) / 'result.json').read_text()) for s in seeds]
        top1[variant] = {rs.key_size(k): [r['top1'][k] for r in results] for k in keys}
        for s, r in zip(seeds, results, strict=False):
            devices[s].add(r['device'])
    return dict(cell=cell, label=cell_recipe(cell).label, seeds=list(seeds), image_size=config.image_size,
                top1=top1, devices=['+'.join(sorted(devices[s])) for s in seeds])


def split_by_device(data: dict) -> list[dict]:
    """A cell whose seeds were trained on more than one device (a GPU's seeds beside the CPU's), as one cell per
    device with that device's seeds; [] when every seed trained on one device."""
    devices = list(dict.fromkeys(data['devices']))
    if len(devices) < 2:
        return []
    parts = []
    for device in devices:
        keep = [i for i, d in enumerate(data['devices']) if d == device]
        seeds = [data['seeds'][i] for i in keep]
        parts.append(dict(data, cell=f'{data["cell"]} ({device}, seeds {",".join(map(str, seeds))})', seeds=seeds,
                          devices=[device] * len(keep),
                          top1={v: {size: [vals[i] for i in keep] for size, vals in sizes.items()}
                                for v, sizes in data['top1'].items()}))
    return parts


def verdict(data: dict) -> list[dict]:
    """Per test size: the encodings by mean top-1, the leader's lead over the second (paired by seed: mean, std,
    and in how many seeds it leads), and each encoding's change from the training size."""
    rows, base = [], data['image_size']
    for size in data['top1'][ENCODINGS[0]]:
        means = {v: mean_std(data['top1'][v][size])[0] for v in ENCODINGS}
        order = sorted(ENCODINGS, key=lambda v: -means[v])
        lead = [a - b for a, b in zip(data['top1'][order[0]][size], data['top1'][order[1]][size], strict=False)]
        row = dict(recipe=data['cell'], size=size, factor=round(size / base, 2), order=order,
                   leader=order[0], second=order[1], lead_mean=mean_std(lead)[0], lead_std=mean_std(lead)[1],
                   lead_seeds=f'{sum(d > 0 for d in lead)}/{len(lead)}', seeds=len(lead))
        for v in ENCODINGS:
            m, s = mean_std(data['top1'][v][size])
            dm, ds = mean_std([a - b for a, b in zip(data['top1'][v][size], data['top1'][v][base], strict=False)])
            row[f'{v}_top1'], row[f'{v}_std'], row[f'{v}_change'], row[f'{v}_change_std'] = m, s, dm, ds
        rows.append(row)
    return rows


def paper_claim(data: dict, peg: str) -> str:
    """The paper's claim at 1.4x (CPVT-Ti gains without fine-tuning while DeiT's learned table drops):
    'reproduced' if the PEG model gains and loses less than the table in every seed, 'partly' if it loses but
    less than the table in every seed, 'not reproduced' otherwise."""
    base, size = data['image_size'], round(data['image_size'] * 1.43)
    sizes = list(data['top1'][peg])
    size = min(sizes, key=lambda s: abs(s - size))
    change = {v: [a - b for a, b in zip(data['top1'][v][size], data['top1'][v][base], strict=True)]
              for v in (peg, 'learned')}
    better = all(p > t for p, t in zip(change[peg], change['learned'], strict=False))
    gain = mean_std(change[peg])[0]
    text = f'{gain:+.2f} vs table {mean_std(change["learned"])[0]:+.2f}'
    if gain > 0 and better:
        return f'reproduced ({text})'
    return f'{"partly" if better else "not reproduced"} ({text})'


def order_movement(default: dict, other: dict, size: int) -> tuple[int, float]:
    """How much a recipe moves the encodings' order at one test size against the default: the number of pairs
    whose order flips, then the summed change of each encoding's distance from the mean of all five."""
    def centred(data):
        means = {v: sum(data['top1'][v][size]) / len(data['top1'][v][size]) for v in ENCODINGS}
        mid = sum(means.values()) / len(means)
        return {v: m - mid for v, m in means.items()}
    a, b = centred(default), centred(other)
    flips = sum((a[u] - a[v]) * (b[u] - b[v]) < 0 for u, v in itertools.combinations(ENCODINGS, 2))
    return flips, round(sum(abs(a[v] - b[v]) for v in ENCODINGS), 2)


def needs_more_seeds(data: dict) -> bool:
    """True when, at 2x (the order the sweep is about), the leader does not lead the second in every seed."""
    return any(row['factor'] == 2 and not row['lead_seeds'].startswith(f'{row["seeds"]}/') for row in verdict(data))


def plot(cells: list[dict], path: Path) -> None:
    plt = pyplot()
    base = cells[0]['image_size']
    sizes = list(cells[0]['top1'][ENCODINGS[0]])
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.4 * len(sizes), 4.6), squeeze=False)
    x = range(len(cells))
    for ax, size in zip(axes[0], sizes, strict=False):
        for k, v in enumerate(ENCODINGS):
            values = [[a - (b if size != base else 0)
                       for a, b in zip(c['top1'][v][size], c['top1'][v][base], strict=True)]
                      for c in cells]
            stats = [mean_std(vals) for vals in values]
            ax.errorbar([i + (k - 2) * 0.08 for i in x], [m for m, _ in stats], yerr=[s for _, s in stats],
                        capsize=2, label=rs.VARIANTS[v].label, **rs.line_style(v, plt))
        ax.set_xticks(list(x), [c['cell'] for c in cells], rotation=60, ha='right', fontsize=7)
        ax.set_title(f'{size} px ({size / base:.2g}x)' + ('' if size == base else ': change from 1x'), fontsize=9)
        ax.set_ylabel('top-1 (%)' if size == base else 'change (points)')
        ax.grid(alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc='upper center', ncol=len(ENCODINGS), fontsize=8,
               bbox_to_anchor=(0.5, 1.06))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def verdict_table(rows: list[dict]) -> list[str]:
    """The verdict rows as a Markdown table: order, the leader's paired lead, every encoding's top-1 and change."""
    lines = ['| recipe | seeds | test | order (best first) | lead of the first over the second (paired) | '
             + ' | '.join(f'{v} top-1 (change)' for v in ENCODINGS) + ' |', '|---|---|---|---|---|' +
             '---|' * len(ENCODINGS)]
    for r in rows:
        lines.append(f'| {r["recipe"]} | {r["seeds"]} | {r["size"]} px ({r["factor"]:g}x) | '
                     + ' > '.join(r['order']) + f' | {r["lead_mean"]:+.2f} ± {r["lead_std"]:.2f} '
                     f'({r["lead_seeds"]} seeds) | ' + ' | '.join(
                         f'{r[f"{v}_top1"]:.1f} ± {r[f"{v}_std"]:.1f}' + (
                             f' ({r[f"{v}_change"]:+.1f} ± {r[f"{v}_change_std"]:.1f})' if r['factor'] != 1 else '')
                         for v in ENCODINGS) + ' |')
    return lines


def write_outputs(cells: list[dict], sweep: Sweep, meta: dict) -> None:
    rows = [row for c in cells for row in verdict(c)]
    device_rows = [row for c in cells for part in split_by_device(c) for row in verdict(part)]
    claims = {c['cell']: {peg: paper_claim(c, peg) for peg in ('peg_0', 'peg_0-5')} for c in cells}
    out = sweep.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv([{k: (' > '.join(v) if k == 'order' else v) for k, v in r.items()} for r in rows],
              out / f'{sweep.tag}.csv')
    (out / f'{sweep.tag}.json').write_text(json.dumps(dict(meta=meta, cells=cells, verdict=rows,
                                                           verdict_by_device=device_rows, paper=claims), indent=2))
    lines = verdict_table(rows)
    if device_rows:
        lines += ['', 'Recipes whose seeds trained on more than one device, each device\'s seeds alone (the same '
                  'seed gives a different run on another device: its dropout masks and arithmetic differ):', '']
        lines += verdict_table(device_rows)
    lines += ['', "The paper's claim at 1.4x (a gain without fine-tuning while the learned table drops), change "
              'in points paired by seed:', '', '| recipe | PEG after block 0 | PEGs after blocks 0-5 |',
              '|---|---|---|']
    lines += [f'| {cell} | {c["peg_0"]} | {c["peg_0-5"]} |' for cell, c in claims.items()]
    if meta.get('pair'):
        lines += ['', f'2 x 2 factors: {meta["pair"]} (order movement at 2x per factor, flipped pairs and summed '
                  f'shift: {meta["movement"]})']
    (out / f'{sweep.tag}.md').write_text('\n'.join(lines) + f'\n\nTop-1 (%) mean ± std over seeds on Fashion-MNIST '
                                         f'({meta["scale"]} scale). Run time of the invocation: '
                                         f'{meta["wall_minutes"]} min on {meta["device"]}.\n\n`{meta["command"]}`\n')
    plot(cells, out / f'{sweep.tag}.png')
    print('\n'.join(lines))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--scale', choices=tuple(SCALES), default='small')
    p.add_argument('--cells', nargs='+', default=['default', *FACTORS, 'cls'],
                   help='recipes to run: default, cls, a factor, or F1+F2')
    p.add_argument('--pair', default='auto', help="the 2 x 2's two factors: 'auto', 'F1+F2', or 'none'")
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p.add_argument('--pair-seeds', type=int, nargs='+', default=[0, 1])
    p.add_argument('--max-seeds', type=int, default=5, help='seeds a cell may grow to where the order is unclear')
    p.add_argument('--jobs', type=int, default=2, help='runs trained at once (processes)')
    p.add_argument('--threads', type=int, default=1, help='torch threads per process')
    p.add_argument('--device', default='cpu')
    p.add_argument('--data', default=str(rs.DEFAULT_ROOT), help='directory with the Fashion-MNIST IDX files')
    p.add_argument('--study-options', default='',
                   help="resolution_study options for every cell, after the scale's (e.g. '--test-images 500')")
    p.add_argument('--work-dir', default=str(RUNS),
                   help='where the runs are kept (their result.json files are committed; weights are not)')
    p.add_argument('--out', default=str(ROOT / 'benchmarks/results'))
    args = p.parse_args(argv)
    for cell in args.cells + ([] if args.pair in ('auto', 'none') else [args.pair]):
        try:
            cell_recipe(cell)
        except ValueError as e:
            p.error(str(e))
    return args


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    start = time.perf_counter()
    sweep = Sweep(args.scale, args.device, args.data, Path(args.work_dir), Path(args.out),
                  tuple(shlex.split(args.study_options)))
    rs.ensure_data(Path(args.data))
    done: dict[str, dict] = {}

    def run_and_load(cells: dict[str, list[int]]) -> None:
        """Run, then add seeds where the order is unclear, until it is or --max-seeds is reached."""
        while cells:
            run_cells(sweep, cells, args.jobs, args.threads)
            loaded = {c: load_cell(sweep, c, s) for c, s in cells.items()}
            done.update(loaded)
            cells = {c: s + [max(s) + 1] for c, s in cells.items()
                     if needs_more_seeds(loaded[c]) and len(s) < args.max_seeds}
    run_and_load({cell: list(args.seeds) for cell in args.cells})
    pair, movement = None, {}
    if args.pair != 'none' and 'default' in done:
        factors = [c for c in done if c in FACTORS]
        size = 2 * done['default']['image_size']
        movement = {f: order_movement(done['default'], done[f], size) for f in factors}
        pair = args.pair if args.pair != 'auto' else (
            '+'.join(sorted(movement, key=lambda f: movement[f], reverse=True)[:2]) if len(factors) >= 2 else None)
        if pair:
            run_and_load({pair: list(args.pair_seeds)})
    cells = [done[c] for c in ['default', *FACTORS, pair, 'cls'] if c in done] + \
        [done[c] for c in done if c not in ['default', *FACTORS, pair, 'cls']]
    meta = dict(run_meta('benchmarks.recipe_sweep', argv, start), scale=args.scale, device=args.device,
                pair=pair, movement=movement, encodings=list(ENCODINGS))
    write_outputs(cells, sweep, meta)
    return cells


if __name__ == '__main__':
    main()
