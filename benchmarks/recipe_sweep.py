"""The resolution verdict across training recipes: the crop protocol with global average pooling, one factor at a
time from the default recipe, five encodings, seeds fixed in advance (design and results: docs/resolution_study.md).

    python -m benchmarks.recipe_sweep [--scale small|large] [--cells default aliased ... F1+F2 cls]
        [--seeds 0 1 2] [--jobs N] [--threads T] [--device cpu|cuda] [--set FIELD=VALUE ...]

Each cell is one resolution study (``benchmarks.resolution_study.run_study``; its outputs under
``--out/recipe_sweep[_large]/``) whose ``StudyConfig`` is the default recipe's (``SCALES`` and ``COMMON``) with
fields replaced: the default, each factor of ``FACTORS``, two factors at once ('F1+F2'), and the class-token
head ('cls'). A test-time factor (bicubic resizing) tests the default's saved models again. ``--set
FIELD=VALUE`` replaces a field in every cell (a smaller test, say: ``--set test_images=500``). ``--scale large``
(``SCALES``): every Fashion-MNIST image on the paper's 14 x 14 token grid, a GPU's scale (``--device cuda``).

Runs train ``--jobs`` at once, each with ``--threads`` torch threads (in this process where ``--jobs`` is 1);
every run is resumable (the trainer's checkpoints), so an interrupted sweep continues where it stopped. Writes
``recipe_sweep[_large].{json,csv,md,png}``: per recipe and test size the encodings in order and the leader's lead
over the second (``verdict``), and the paper's claim per recipe (``paper_claim``), each paired by seed with its
95% interval; every table and claim is per recipe and training device (``by_device``), never pooled.
"""
import argparse
import itertools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from benchmarks.resolution_study import run_study
from benchmarks.study.common import format_paired, mean_std, paired, run_meta
from benchmarks.study.config import VARIANTS, StudyConfig, parse_fields
from benchmarks.study.data import ensure_data, load_split
from benchmarks.study.grid import write_report
from benchmarks.study.pool import run_all
from benchmarks.study.report import line_style
from benchmarks.study.specs import size_tests
from benchmarks.study.trainer import run
from cpvt_backbones.utils import pyplot

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / 'benchmarks/results/recipe_runs'
ENCODINGS = ('none', 'learned', 'peg_0', 'peg_0-5', 'rope_mixed')
SCALES: dict[str, dict] = {
    'small': dict(image_size=14, patch=2, train_images=20000, epochs=4, test_images=2500, probe_images=500),
    'large': dict(image_size=14, patch=1, train_images=60000, epochs=4, test_images=10000, probe_images=1000),
}
COMMON = dict(head='gap', test_sizes=(14, 20, 28, 42), variants=ENCODINGS)


class Recipe(NamedTuple):
    label: str
    train: Mapping[str, object] = {}   # StudyConfig fields that change training
    test: Mapping[str, object] = {}    # fields that change only the tests (the default's saved models are reused)
    schedule: int = 1                  # the epochs the scale sets, multiplied


DEFAULT = Recipe('default')
FACTORS: dict[str, Recipe] = {
    'aliased': Recipe('aliased crops', dict(crop_resample='aliased')),
    'width96': Recipe('width 96, 3 heads', dict(dim=96, heads=3)),
    'lr2e-3': Recipe('peak learning rate 2e-3', dict(lr=2e-3)),
    'decay_position': Recipe('weight decay on position parameters', dict(decay_position=True)),
    'schedule3x': Recipe('3x longer schedule', schedule=3),
    'bicubic': Recipe('bicubic test resizing', test=dict(test_resample='bicubic')),
}
CLS = Recipe('class token head', dict(head='cls'))


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
    return Recipe(' + '.join(r.label for r in recipes), {k: v for r in recipes for k, v in r.train.items()},
                  {k: v for r in recipes for k, v in r.test.items()},
                  schedule=max(r.schedule for r in recipes))


@dataclass(frozen=True)
class Sweep:
    """The cells' common config: the scale's fields and ``COMMON``, then ``base`` (device, data, work_dir and any
    ``--set``); cell outputs go to ``out/TAG/``."""
    scale: str
    out: Path
    base: Mapping[str, object] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return 'recipe_sweep' if self.scale == 'small' else f'recipe_sweep_{self.scale}'

    def config(self, cell: str, seeds: Sequence[int]) -> StudyConfig:
        """A cell's study: the default recipe with the cell's fields replaced; cells with the same training
        share their runs."""
        recipe = cell_recipe(cell)
        train_key = '+'.join(p for p in cell.split('+') if p in ('default', 'cls') or FACTORS[p].train
                             or FACTORS[p].schedule != 1)
        default = StudyConfig(**SCALES[self.scale], **COMMON).replace(**self.base)
        return default.replace(**recipe.train, **recipe.test, epochs=default.epochs * recipe.schedule,
                               name=f'{self.tag}_{cell}', runs=f'{self.tag}_{train_key or "default"}',
                               seeds=tuple(seeds), out=self.out / self.tag)


def train_one(data: tuple, config: StudyConfig, variant: str, seed: int) -> str:
    """One run on ``data`` (the training and test splits): trained (or resumed) and tested; its name."""
    run(variant, seed, config, data, config.run_dir(variant, seed))
    return f'{config.run_set}/{variant}-seed{seed}'


def run_cells(sweep: Sweep, cells: Sequence[str], seeds: Sequence[int], jobs: int, threads: int) -> None:
    """Train every run the cells need, once per training recipe, encoding and seed (``pool.run_all``: ``jobs`` at
    once, ``threads`` torch threads each); then each cell's study (the tests it adds run on the saved models)."""
    todo = {}   # by the data they train on, each run once (cells with the same training share their runs)
    for cell in cells:
        config = sweep.config(cell, seeds)
        runs = todo.setdefault((config.data, config.train_images, config.test_images), {})
        for seed, variant in itertools.product(seeds, ENCODINGS):
            runs.setdefault((config.run_set, variant, seed), (config, variant, seed))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)   # one job runs here, with --threads as each of more jobs does in its process
    try:
        for (path, train_images, test_images), calls in todo.items():
            data = load_split(path, 'train', train_images), load_split(path, 'test', test_images)
            run_all(train_one, list(calls.values()), data, jobs, threads, 'sweep')
    finally:
        torch.set_num_threads(previous)
    for cell in cells:
        run_study(sweep.config(cell, seeds))


def load_cell(sweep: Sweep, cell: str, seeds: Sequence[int]) -> dict:
    """Per encoding and test size (1x, 1.4x, 2x, 3x): top-1 per seed, from the runs' result.json."""
    config = sweep.config(cell, seeds)
    tests = size_tests(config)
    top1, devices = {}, {s: set() for s in seeds}
    for variant in ENCODINGS:
        results = [json.loads((config.run_dir(variant, s) / 'result.json').read_text()) for s in seeds]
        top1[variant] = {t.size: [r['top1'][t.key] for r in results] for t in tests}
        for s, r in zip(seeds, results, strict=True):
            devices[s].add(r['device'])
    return dict(cell=cell, label=cell_recipe(cell).label, seeds=list(seeds), image_size=config.image_size,
                top1=top1, devices=['+'.join(sorted(devices[s])) for s in seeds])


def by_device(data: dict) -> list[dict]:
    """A cell as one cell per training device, each with that device's seeds and named 'CELL (DEVICE)': the
    same seed gives a different run on another device (its drop-path masks and arithmetic differ), so no
    comparison mixes devices."""
    parts = []
    for device in dict.fromkeys(data['devices']):
        keep = [i for i, d in enumerate(data['devices']) if d == device]
        parts.append(dict(data, cell=f'{data["cell"]} ({device})', seeds=[data['seeds'][i] for i in keep],
                          devices=[device] * len(keep),
                          top1={v: {size: [vals[i] for i in keep] for size, vals in sizes.items()}
                                for v, sizes in data['top1'].items()}))
    return parts


def verdict(data: dict) -> list[dict]:
    """Per test size: the encodings by mean top-1, the leader's lead over the second paired by seed (``paired``:
    mean, spread, 95% interval; the sign '+' only where the interval excludes zero), and each encoding's top-1
    and change from the training size (paired by seed)."""
    rows, base = [], data['image_size']
    for size in data['top1'][ENCODINGS[0]]:
        means = {v: mean_std(data['top1'][v][size])[0] for v in ENCODINGS}
        order = sorted(ENCODINGS, key=lambda v: -means[v])
        row = dict(recipe=data['cell'], size=size, factor=round(size / base, 2), order=order, leader=order[0],
                   second=order[1], lead=paired(data['top1'][order[0]][size], data['top1'][order[1]][size]),
                   seeds=','.join(map(str, data['seeds'])))
        for v in ENCODINGS:
            row[f'{v}_top1'] = mean_std(data['top1'][v][size])
            row[f'{v}_change'] = paired(data['top1'][v][size], data['top1'][v][base])
        rows.append(row)
    return rows


def paper_claim(data: dict, peg: str) -> str:
    """The paper's claim at 1.4x (CPVT-Ti gains without fine-tuning while DeiT's learned table drops), paired by
    seed: 'reproduced' where the PEG model's change and its difference from the table's change both have
    intervals above zero, 'not reproduced' where the PEG model's change or that difference is below zero,
    'undecided' otherwise."""
    base, size = data['image_size'], round(data['image_size'] * 1.43)
    size = min(data['top1'][peg], key=lambda s: abs(s - size))
    change = {v: [a - b for a, b in zip(data['top1'][v][size], data['top1'][v][base], strict=True)]
              for v in (peg, 'learned')}
    own, against = paired(change[peg], [0.] * len(change[peg])), paired(change[peg], change['learned'])
    text = f'change {format_paired(own)}, minus the table\'s {format_paired(against)}'
    if own['sign'] == '+' and against['sign'] == '+':
        return f'reproduced ({text})'
    return f'{"not reproduced" if "-" in (own["sign"], against["sign"]) else "undecided"} ({text})'


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
                        capsize=2, label=VARIANTS[v].label, **line_style(v, plt))
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
        lead = format_paired(r['lead']) + ('' if r['lead']['sign'] == '+' else ' (tied)')
        lines.append(f'| {r["recipe"]} | {r["seeds"]} | {r["size"]} px ({r["factor"]:g}x) | '
                     + ' > '.join(r['order']) + f' | {lead} | ' + ' | '.join(
                         '{:.1f} ± {:.1f}'.format(*r[f'{v}_top1']) + (
                             f' ({format_paired(r[f"{v}_change"])})' if r['factor'] != 1 else '')
                         for v in ENCODINGS) + ' |')
    return lines


def write_outputs(cells: list[dict], sweep: Sweep, meta: dict) -> None:
    parts = [part for c in cells for part in by_device(c)]
    rows = [row for part in parts for row in verdict(part)]
    claims = {part['cell']: {peg: paper_claim(part, peg) for peg in ('peg_0', 'peg_0-5')} for part in parts}
    lines = ['Each recipe per training device (its seeds listed): the same seed gives a different run on another '
             'device.', ''] + verdict_table(rows)
    lines += ['', "The paper's claim at 1.4x (a gain without fine-tuning while the learned table drops), change "
              'in points paired by seed with its 95% interval:', '',
              '| recipe | PEG after block 0 | PEGs after blocks 0-5 |', '|---|---|---|']
    lines += [f'| {cell} | {c["peg_0"]} | {c["peg_0-5"]} |' for cell, c in claims.items()]
    markdown = ('\n'.join(lines) + f'\n\nTop-1 (%) mean ± std over seeds on Fashion-MNIST ({meta["scale"]} scale). '
                f'Run time of the invocation: {meta["wall_minutes"]} min on {meta["device"]}.\n\n`{meta["command"]}`\n')
    table = [{k: (' > '.join(v) if k == 'order' else format_paired(v) if isinstance(v, dict) else v)
              for k, v in r.items()} for r in rows]
    write_report(sweep.out, sweep.tag, dict(meta=meta, cells=cells, verdict=rows, paper=claims), markdown, table,
                 {'': lambda path: plot(parts, path)})
    print('\n'.join(lines))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--scale', choices=tuple(SCALES), default='small')
    p.add_argument('--cells', nargs='+', default=['default', *FACTORS, 'cls'],
                   help='recipes to run: default, cls, a factor, or F1+F2')
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2], help='fixed before the sweep runs')
    p.add_argument('--jobs', type=int, default=2, help='runs trained at once (processes)')
    p.add_argument('--threads', type=int, default=1, help='torch threads per run (in this process where --jobs is 1)')
    p.add_argument('--device', default='cpu')
    p.add_argument('--data', type=Path, default=StudyConfig().data, help='directory with the Fashion-MNIST IDX files')
    p.add_argument('--set', nargs='+', default=[], metavar='FIELD=VALUE',
                   help="StudyConfig fields replaced in every cell, after the scale's (e.g. test_images=500)")
    p.add_argument('--work-dir', type=Path, default=RUNS,
                   help='where the runs are kept (their result.json files are committed; weights are not)')
    p.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results')
    args = p.parse_args(argv)
    try:
        for cell in args.cells:
            cell_recipe(cell)
        args.set = parse_fields(args.set)
        Sweep(args.scale, args.out, args.set).config('default', args.seeds)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    start = time.perf_counter()
    sweep = Sweep(args.scale, args.out, dict(args.set, device=args.device, data=args.data, work_dir=args.work_dir))
    ensure_data(args.data)
    run_cells(sweep, args.cells, args.seeds, args.jobs, args.threads)
    cells = [load_cell(sweep, cell, args.seeds) for cell in args.cells]
    meta = dict(run_meta('benchmarks.recipe_sweep', argv, start), scale=args.scale, device=args.device,
                encodings=list(ENCODINGS))
    write_outputs(cells, sweep, meta)
    return cells


if __name__ == '__main__':
    main()
