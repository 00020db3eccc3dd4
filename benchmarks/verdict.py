"""The resolution verdict's tables (and the demo's), rendered from the committed result files, one training device
per comparison.

    python -m benchmarks.verdict            # print every table
    python -m benchmarks.verdict --write    # and rewrite them where README.md and docs/ hold them

Every table compares runs trained on one device: a study whose runs trained on several is split by device, and a
table says which. Differences are paired by seed (``benchmarks.study.common.paired``): the mean, and the 95% t interval
over seeds; a difference is called (a leader, an agreeing paper pair, "loses more") only where the interval
excludes zero, otherwise it is tied or undecided. The documents hold each table between
``<!-- verdict:NAME -->`` and ``<!-- /verdict:NAME -->``; ``tests/test_verdict.py`` renders them again from
the result files and compares.

The tables are declared, not coded: ``BLOCKS`` lists each as a ``Block`` (its name, the comparison, what it reads:
a ``Study``'s runs on one device as a typed ``Summary``, a ``Dense`` or ``Native`` study as its typed summary, a
``Record`` as written, a ``Recipe``), and ``render``, the one renderer, loads the inputs and calls the comparison;
every table goes through ``table``. A new table is one ``Block`` (and, for a new kind of comparison, one function of
typed summaries).
"""
import argparse
import itertools
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.native_detail.render import render_markdown as native_markdown
from benchmarks.native_detail.spec import Native, NativeSummary
from benchmarks.study import report
from benchmarks.study.common import format_paired, mean_std, paired
from benchmarks.study.config import VARIANTS, StudyConfig
from benchmarks.study.summary import (
    DEVICES,
    EACH,
    RESULTS,
    SEEDS,
    Dense,
    DenseSummary,
    Recipe,
    Record,
    RecordData,
    Study,
    Summary,
    load,
    load_input,
    load_study,
)
from cpvt_backbones.utils import pyplot

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / 'README.md', ROOT / 'docs/resolution_study.md', ROOT / 'docs/performance.md',
             ROOT / 'docs/reliability.md')
# The crop protocol with a class token (the paper's ablation set-up): the study of all fifteen encodings, whose
# five central ones trained on a GPU, their retraining on the CPU, and PVTv2's convolutional MLP (CPU).
HEADLINE = ('resolution_crop_cls', 'resolution_crop_cls_cpu', 'recipe_sweep/recipe_sweep_cls',
            'resolution_crop_cls_conv_mlp')
# The recipe sweep's cells (recipe_sweep.py): each the default recipe with one or two fields replaced; a cell's
# studies pool runs of the same recipe (the bicubic cell only tests the default's models another way: not a recipe).
RECIPES = {
    'default (GAP)': ('recipe_sweep/recipe_sweep_default', 'recipe_sweep/recipe_sweep_default_cpu',
                      'recipe_sweep/recipe_sweep_default_conv_mlp'),
    'class token': ('recipe_sweep/recipe_sweep_cls', 'resolution_crop_cls_cpu', 'resolution_crop_cls_conv_mlp'),
    'aliased crops': ('recipe_sweep/recipe_sweep_aliased', 'recipe_sweep/recipe_sweep_aliased_cpu'),
    'position weights decayed': ('recipe_sweep/recipe_sweep_decay_position',),
    'lr 2e-3': ('recipe_sweep/recipe_sweep_lr2e-3',),
    'schedule 3x': ('recipe_sweep/recipe_sweep_schedule3x',),
    'width 96': ('recipe_sweep/recipe_sweep_width96',),
    'width 96, schedule 3x': ('recipe_sweep/recipe_sweep_width96+schedule3x',),
    '60,000 images': ('recipe_sweep_large/recipe_sweep_large_default',),
}


def torch_of(name: str, results: Path = RESULTS) -> str:
    """The torch version that the study ``name``'s invocation recorded (its runs share it where they trained in
    that invocation)."""
    return load(name, results)['meta'].get('torch', 'unrecorded')


def change(seeds: dict[int, dict[str, float]], key: str, base: str) -> list[float]:
    return [top1[key] - top1[base] for _, top1 in sorted(seeds.items())]


def loss(seeds: dict[int, dict[str, float]], key, base) -> dict:
    """The change from ``base`` to ``key`` over the seeds, as ``paired`` gives it (against no change)."""
    diffs = change(seeds, str(key), str(base))
    return paired(diffs, [0.] * len(diffs))


def common(a: dict[int, dict], b: dict[int, dict]) -> tuple[dict, dict]:
    """The seeds both have (pairing needs the same seeds)."""
    shared = sorted(set(a) & set(b))
    return {s: a[s] for s in shared}, {s: b[s] for s in shared}


def cell(d: dict) -> str:
    """A paired difference as a table cell: mean [95% interval], bold where the interval excludes zero."""
    text = format_paired(d)
    return f'**{text}**' if d['sign'] != '=' else text


def leader(values: dict[str, list[float]]) -> str:
    """Which variant is highest in ``values`` (variant -> per-seed values on the same seeds), named only where its
    paired interval against every other variant excludes zero: 'X, ahead of every other (of Y, the runner-up, by
    d [lo, hi])', else 'no leader: X highest on average, not separated from A, B'."""
    ranked = sorted(values, key=lambda v: sum(values[v]) / len(values[v]), reverse=True)
    first, second = ranked[:2]
    tied = [v for v in ranked[1:] if paired(values[first], values[v])['sign'] != '+']
    if not tied:
        return (f'{VARIANTS[first].label}, ahead of every other (of {VARIANTS[second].label}, the runner-up, by '
                f'{format_paired(paired(values[first], values[second]))})')
    return (f'no leader: {VARIANTS[first].label} highest on average, not separated from '
            + ', '.join(VARIANTS[v].label for v in tied))


def size_heading(size: int, base: int) -> str:
    return f'{size} px ({size / base:.2g}x)'


# The central comparison with five seeds, fixed before they ran: the default recipe's table and PEGs after blocks
# 0-5, one GPU, TF32 off (the TF32 question's "off" study, seeds 3 and 4 added later on the same kind of GPU).
CENTRAL = 'tf32/recipe_sweep_tf32_off'
CENTRAL_SEEDS = (0, 1, 2, 3, 4)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The one Markdown table renderer: a header, its rule, a line per row."""
    return (['|' + '|'.join(f' {c} ' if c else ' ' for c in header) + '|', '|' + '---|' * len(header)]
            + ['| ' + ' | '.join(row) + ' |' for row in rows])


def change_heads(s: Summary) -> list[str]:
    return [f'change at {size_heading(x, s.base)}' for x in s.sizes]


def changes(s: Summary, note: str, paper: bool = False, leaders: bool = False, probe: bool = False,
            first: str = 'position encoding', labels: Mapping[str, str] | None = None, losing: bool = False) -> str:
    """Per variant (``labels``: those shown, and their labels): top-1 at the training size and the change to every
    larger size paired by seed; ``paper``: the paper's figure beside; ``leaders``: which variant is highest and
    which loses least at each size (``leader``); ``probe``: the position probe's table; ``losing``: how many seeds
    lose at each size; ``note``: the text after, formatted with ``Summary.fields``."""
    rows = []
    for variant in labels or s.variants():
        seeds = s.seeds(variant)
        m, sd = mean_std(s.at_base(variant), 1)
        cells = []
        for size in s.sizes:
            text = cell(loss(seeds, size, s.base))
            if losing:
                text += f' ({sum(v < 0 for v in change(seeds, str(size), str(s.base)))} of {len(seeds)} seeds lose)'
            cells.append(text)
        figure = VARIANTS[variant].paper
        rows.append([labels[variant] if labels else VARIANTS[variant].label]
                    + (['—' if figure is None else f'{figure:.1f}'] if paper else []) + [f'{m:.1f} ± {sd:.1f}'] + cells)
    lines = table([first] + (['paper'] if paper else []) + [f'{s.base} px (1x)'] + change_heads(s), rows)
    if leaders:
        ordered = {v: dict(sorted(t.items())) for v, t in s.top1.items()}
        base = str(s.base)
        lines += ['', f'Highest top-1 at {base} px: '
                  + leader({v: [t[base] for t in ts.values()] for v, ts in ordered.items()}) + '. Least loss at '
                  + '; at '.join(f'{size_heading(size, s.base)}: ' + leader({v: change(ts, str(size), base)
                                                                             for v, ts in ordered.items()})
                                 for size in s.sizes) + '.']
    if probe:
        lines += [''] + probe_table(s, [s.base] + s.sizes)
    return '\n'.join(lines) + '\n\n' + note.format(**s.fields())


def probe_table(s: Summary, sizes: Sequence[int]) -> list[str]:
    """The position probe's R² (``benchmarks.study.trainer.position_probe``) at every size, mean ± std over the seeds
    ``SEEDS`` of the runs trained on the summary's device."""
    probes = {(r['variant'], r['seed']): r['probe']['r2'] for r in s.runs
              if r['seed'] in SEEDS and r['device'] == s.device and 'probe' in r}
    rows = []
    for variant in (v for v in VARIANTS if any(k[0] == v for k in probes)):
        values = [[probes[(variant, seed)][str(size)] for seed in SEEDS if (variant, seed) in probes]
                  for size in sizes]
        rows.append([VARIANTS[variant].label] + ['{:.2f} ± {:.2f}'.format(*mean_std(v)) for v in values])
    return table(['position probe R²'] + [f'{x} px' for x in sizes], rows)


def probe(s: Summary, note: str) -> str:
    """The position probe at every test size."""
    return '\n'.join(probe_table(s, s.meta['test_sizes'])) + '\n\n' + note.format(**s.fields())


def at_training_size(columns: Mapping[str, Summary], note: str) -> str:
    """Top-1 at the training size per variant (those of the first column), a column per summary, the paper
    beside."""
    first = next(iter(columns.values()))
    rows = []
    for variant in first.variants():
        figure = VARIANTS[variant].paper
        cells = ['{:.1f} ± {:.1f}'.format(*mean_std(s.at_base(variant), 1)) if variant in s.top1 else '—'
                 for s in columns.values()]
        rows.append([VARIANTS[variant].label, '—' if figure is None else f'{figure:.1f}'] + cells)
    return '\n'.join(table(['position encoding', 'paper', *columns], rows)) + '\n\n' + note


def paper_pairs(s: Summary, gap: float = 0.5) -> str:
    """The pairs of encodings the paper separates by at least ``gap`` points, ours paired by seed on one device:
    agreeing or reversed where the 95% interval excludes zero, otherwise undecided."""
    base = str(s.base)
    named = [v for v in VARIANTS if v in s.top1 and VARIANTS[v].paper is not None]
    verdicts: dict[str, list[str]] = {'agrees': [], 'reversed': [], 'undecided': []}
    for a, b in itertools.combinations(named, 2):
        pa, pb = VARIANTS[a].paper, VARIANTS[b].paper
        if abs(pa - pb) < gap:
            continue
        hi, lo = (a, b) if pa > pb else (b, a)
        x, y = common(s.top1[hi], s.top1[lo])
        d = paired([t[base] for t in x.values()], [t[base] for t in y.values()])
        verdict = 'agrees' if d['sign'] == '+' else 'reversed' if d['sign'] == '-' else 'undecided'
        verdicts[verdict].append(f'{VARIANTS[hi].label} > {VARIANTS[lo].label} (paper +{abs(pa - pb):.1f}, ours '
                                 f'{format_paired(d)})')
    total = sum(map(len, verdicts.values()))
    lines = [f'Of the {total} pairs the paper separates by at least {gap} points, paired by seed at {base} px on the '
             f'{DEVICES[s.device]}: {len(verdicts["agrees"])} agree, '
             f'{len(verdicts["reversed"])} are reversed and {len(verdicts["undecided"])} undecided (the 95% interval '
             'of the difference includes zero).']
    for verdict in ('reversed', 'undecided'):
        if verdicts[verdict]:
            lines += ['', f'{verdict.capitalize()}: ' + '; '.join(verdicts[verdict]) + '.']
    return '\n'.join(lines)


def difference(x: dict[int, dict], y: dict[int, dict], base: int, sizes: Sequence[int]) -> list[dict]:
    """``x`` minus ``y`` (the same seeds) paired by seed: at ``base``, then in the change to each of ``sizes``."""
    return ([paired([t[str(base)] for t in x.values()], [t[str(base)] for t in y.values()])]
            + [paired(change(x, str(s), str(base)), change(y, str(s), str(base))) for s in sizes])


def recipe_cells(recipes: Mapping[str, Mapping[str, Summary]], a: str, b: str):
    """Per recipe and training device with both variants: (recipe, device, seeds, {what: paired difference}):
    ``a`` minus ``b`` at the training size, then in the change to every larger size."""
    for recipe, per_device in recipes.items():
        for device, s in per_device.items():
            if a not in s.top1 or b not in s.top1:
                continue
            x, y = common(s.top1[a], s.top1[b])
            whats = [f'at {s.base} px'] + [f'in the change to {size_heading(z, s.base)}' for z in s.sizes]
            yield recipe, device, list(x), dict(zip(whats, difference(x, y, s.base, s.sizes), strict=True))


def recipes(recipes: Mapping[str, Mapping[str, Summary]], a: str = 'peg_0-5', b: str = 'learned') -> str:
    """Per recipe and training device: ``a`` against ``b`` paired by seed, top-1 at the training size and the
    difference in the change to every larger size (negative: ``a`` loses more)."""
    rows, tally = [], {}
    for recipe, device, seeds, diffs in recipe_cells(recipes, a, b):
        rows.append([recipe, DEVICES[device], ','.join(map(str, seeds))] + list(map(cell, diffs.values())))
        for what, d in diffs.items():
            tally.setdefault(what, []).append((f'{recipe} ({DEVICES[device]})', d))
    s = next(iter(next(iter(recipes.values())).values()))
    left_out = {}
    for per_device in recipes.values():
        for folder in next(iter(per_device.values())).folders:
            for path in folder.glob('*-seed*/result.json'):
                seed = int(path.parent.name.rsplit('-seed', 1)[1])
                if seed not in SEEDS:
                    left_out.setdefault(folder.name, set()).add(seed)
    summary = []
    for what, entries in tally.items():
        ahead = [n for n, d in entries if d['sign'] == '+']
        behind = [n for n, d in entries if d['sign'] == '-']
        summary.append(f'{what}: ahead in {len(ahead)}, behind in {len(behind)}'
                       + (f' ({", ".join(behind)})' if 0 < len(behind) <= 3 else '')
                       + f', undecided in {len(entries) - len(ahead) - len(behind)}')
    return '\n'.join(table(['recipe', 'trained on', 'seeds', f'top-1 at {s.base} px', *change_heads(s)], rows)) + (
        f'\n\n{VARIANTS[a].label} minus {VARIANTS[b].label}, paired by seed within one recipe and one training '
        'device: mean [95% interval]; bold where the interval excludes zero (negative in a change column: the PEGs '
        'lose more than the table). Seeds 0-2 where a device has them (the seeds fixed in advance). From the '
        'recipe sweep\'s result files (benchmarks/results/recipe_sweep*/).\n\n'
        f'Of the {len(rows)} cells, the PEGs after blocks 0-5 against the table ' + '; '.join(summary) + '.'
        + ('\n\nRuns on disk outside the seeds fixed in advance, left out of every table (`recipe_runs/`): '
           + '; '.join(f'{folder} seeds {", ".join(map(str, sorted(seeds)))}'
                       for folder, seeds in sorted(left_out.items())) + '.' if left_out else ''))


def pair_rows(first: Mapping[str, Summary], second: Mapping[str, Summary], rows: Sequence[tuple[str, str, str]],
              labels: Mapping[tuple[str, str], str] | None = None) -> list[list[str]]:
    """Rows (variant, device of ``first``, device of ``second``; those with runs on both): ``first`` minus
    ``second`` paired by seed, at the training size and in the change to each larger size; ``labels``: the
    device column's text per (device, device) where not the devices' names."""
    s = next(iter(first.values()))
    out = []
    for variant, device_a, device_b in rows:
        if device_a not in first or device_b not in second or variant not in first[device_a].top1 \
                or variant not in second[device_b].top1:
            continue
        x, y = common(first[device_a].top1[variant], second[device_b].top1[variant])
        if not x:
            continue
        a, b = DEVICES.get(device_a, device_a), DEVICES.get(device_b, device_b)
        where = (labels or {}).get((device_a, device_b), a if device_a == device_b else f'{a} − {b}')
        out.append([VARIANTS[variant].label, where, ','.join(map(str, x))]
                   + list(map(cell, difference(x, y, s.base, s.sizes))))
    return out


def pairs_header(s: Summary) -> list[str]:
    return ['position encoding', 'trained on', 'seeds', f'top-1 at {s.base} px', *change_heads(s)]


def pairs(first: Mapping[str, Summary], second: Mapping[str, Summary], rows: Sequence[tuple[str, str, str]],
          note: str) -> str:
    """``pair_rows`` as a table, then ``note``."""
    return '\n'.join(table(pairs_header(next(iter(first.values()))), pair_rows(first, second, rows))) + '\n\n' + note


def head(gap: Mapping[str, Summary], cls: Mapping[str, Summary]) -> str:
    """Global average pooling minus the class token, per encoding and training device, paired by seed."""
    return pairs(gap, cls, [(v, d, d) for d in DEVICES for v in VARIANTS], (
        'Global average pooling minus the class token, paired by seed within one training device: mean [95% '
        'interval], bold where the interval excludes zero (positive: GAP more accurate, or losing less). Seeds '
        f'{", ".join(map(str, SEEDS))}; the default and class-token cells of the recipe sweep.'))


def device(recipes: Mapping[str, Mapping[str, Summary]], tf32_off: Summary) -> str:
    """The same recipe and seeds trained on the CPU minus on a GPU, per encoding: what the training device moves
    (the reason no table pools the two)."""
    rows = [row for recipe, both in recipes.items()
            for row in pair_rows(both, both, [(v, 'cpu', 'cuda') for v in VARIANTS],
                                 {('cpu', 'cuda'): f'CPU − GPU, {recipe}'})]
    default = recipes['default (GAP)']
    lines = table(pairs_header(default['cpu']), rows)
    cpu_torch = default['cpu'].metas[RECIPES['default (GAP)'][1]].get('torch', 'unrecorded')
    return '\n'.join(lines) + (
        '\n\nThe same recipe, seeds and data order trained on the CPU minus on a GPU, paired by seed: mean [95% '
        'interval], bold where the interval excludes zero. The seeds give the same initialisation, data order '
        'and crops on both devices, not the same run: drop path draws its masks on the device, the arithmetic '
        f'differs, and so does torch: the CPU runs under torch {cpu_torch}, '
        'the GPU runs recorded no version (`tf32` has GPU runs under torch '
        f'{tf32_off.metas[TF32_STUDIES["off"]].get("torch", "unrecorded")}). TF32 had no detected effect there, but '
        'its intervals are wider than this effect, so it is not ruled out.')


# The default recipe's table and PEG 0-5, seeds 0-2, trained on one GPU with TF32 in CUDA matrix
# products and cuDNN convolutions off, on, and at PyTorch's default (resolution_study --tf32).
TF32_STUDIES = {'off': 'tf32/recipe_sweep_tf32_off', 'on': 'tf32/recipe_sweep_tf32_on',
                'default': 'tf32/recipe_sweep_tf32_default'}
TF32_LABELS = {'off': 'GPU, TF32 off', 'on': 'GPU, TF32 on', 'default': "GPU, PyTorch's default"}


def tf32(gpu: Mapping[str, Summary], cpu: Summary, recipe: dict) -> str:
    """Whether TF32 explains the device effect: on the GPU, TF32 on minus off and PyTorch's default minus off;
    then the CPU minus the GPU with TF32 off (full float32 on both), paired by seed (``recipe``: every study
    pooled, which refuses studies of other recipes)."""
    first = {TF32_LABELS[m]: s for m, s in gpu.items()} | {'cpu': cpu}
    rows = [(v, TF32_LABELS[m], TF32_LABELS['off']) for m in ('on', 'default') for v in gpu[m].top1]
    rows += [(v, 'cpu', TF32_LABELS['off']) for v in gpu['off'].top1]
    return pairs(first, first, rows, (
        'Paired by seed: mean [95% interval], bold where the interval excludes zero. The GPU runs trained on one '
        "GPU (`tf32/recipe_sweep_tf32_*.json`: TF32 in CUDA matrix products and cuDNN convolutions off, on, "
        "and PyTorch's default, cuDNN's on and the matrix products' off, which the sweep's GPU runs used); the "
        'CPU runs are the default cell\'s (`recipe_sweep_default_cpu`). Seeds 0-2, the default recipe.'))


def central(s: Summary, note: str, a: str = 'peg_0-5', b: str = 'learned') -> str:
    """``a`` and ``b`` on one device: each one's top-1 at the training size and change at every larger size, and
    ``a`` minus ``b`` paired by seed."""
    rows = []
    for v in (b, a):
        m, sd = mean_std(s.at_base(v), 1)
        rows.append([VARIANTS[v].label, f'{m:.1f} ± {sd:.1f}'] + [cell(loss(s.seeds(v), x, s.base)) for x in s.sizes])
    rows.append([f'{VARIANTS[a].label} − {VARIANTS[b].label}']
                + list(map(cell, difference(s.seeds(a), s.seeds(b), s.base, s.sizes))))
    return '\n'.join(table(['', f'top-1 at {s.base} px', *change_heads(s)], rows)) + '\n\n' + note.format(**s.fields())


def native(s: NativeSummary) -> str:
    """The task whose larger test sizes carry real detail by construction (``benchmarks.native_detail``): its own
    report, rendered again from its runs."""
    return native_markdown(s.summary, s.config, s.meta).rstrip('\n')


DENSE_BACKBONES = {'peg': 'pcpvt_tiny (PEG)', 'pvt': 'mmdet PVT v1 (learned, resized)',
                   'none': 'pcpvt_tiny without PEG', 'learned': 'pcpvt_tiny, learned table (resized)',
                   'rope_mixed': 'pcpvt_tiny, RoPE-Mixed'}   # benchmarks/dense_study's backbones


def dense(s: DenseSummary) -> str:
    """The dense study (one device, the CPU): per task and backbone the score at 1x, the change at 2x and 3x, and
    what drawing the scenes at 2x adds over resizing them, paired by seed; then how many pairs of backbones differ
    in their change, with the interval excluding zero."""
    out = []
    for task, metric in (('detection', 'bbox mAP'), ('segmentation', 'mIoU (%)')):
        scores = {v: s.scores[task].get(v, {}) for v in DENSE_BACKBONES}
        rows = []
        for variant, label in DENSE_BACKBONES.items():
            seeds = scores[variant]
            m, sd = mean_std([t['1'] for t in seeds.values()], 1)
            cells = [loss(seeds, k, '1') for k in ('2', '3')]
            cells.append(paired([t['drawn2'] for t in seeds.values()], [t['2'] for t in seeds.values()]))
            rows.append([label, f'{m:.1f} ± {sd:.1f}'] + list(map(cell, cells)))
        separated = {}
        for key in ('1', '2', '3'):
            count = 0
            for a, b in itertools.combinations(DENSE_BACKBONES, 2):
                x, y = common(scores[a], scores[b])
                d = (paired([t['1'] for t in x.values()], [t['1'] for t in y.values()]) if key == '1' else
                     paired(change(x, key, '1'), change(y, key, '1')))
                count += d['sign'] != '='
            separated[key] = count
        count = len(DENSE_BACKBONES) * (len(DENSE_BACKBONES) - 1) // 2
        out += table([f'{task}: backbone', f'{metric} at 1x', 'change at 2x', 'change at 3x',
                      'drawn minus resized at 2x'], rows)
        out += ['', f'Pairs of {task} backbones whose difference has an interval excluding zero: '
                f'{separated["1"]} of {count} at 1x, {separated["2"]} in the change to 2x, '
                f'{separated["3"]} in the change to 3x.', '']
    return '\n'.join(out[:-1]) + (
        f'\n\nMean ± std and paired differences over seeds {s.seeds} (mean [95% interval], bold '
        f'where the interval excludes zero); every run on the CPU. `{s.name}.json`.')


DEMO = 'demo_run_avx2'   # `make demo` from nothing: tools/demo.py's summary.json with its machine and command
DEMO_ENGINES = 'demo_avx2'   # the same trainings evaluated again on other engines and precisions
DEMO_REFERENCE = 'torch fp32'
DEMO_TOLERANCE = 0.005   # how far an engine and precision may move the demo's metrics


def _out_dir(data: dict) -> str:
    args = shlex.split(data['command'])
    return args[args.index('--out') + 1] if '--out' in args else 'work_dirs/demo'


def demo(run: RecordData) -> str:
    """The demo's detectors and segmentors at every test size, as `make demo` ran them (its engine and precision,
    at each evaluation batch size it ran), from a run that trained everything, with its wall time."""
    name, data = run.name, run.data
    untrained = {'pretraining', *data['task_seconds']} - set(data['trained'])
    if untrained:
        raise ValueError(f'{name}.json does not time the demo from nothing (reused: {sorted(untrained)})')
    tasks = list(data['results'])
    columns = list(next(iter(data['results'][tasks[0]].values())))
    engines = {c.split(' batch ')[0] for c in columns}
    if len(engines) != 1:
        raise ValueError(f'{name}.json holds {sorted(engines)}: the timed run evaluates one engine and precision')
    (engine,) = engines
    labels = data['labels']   # tools/demo.py: each column's model and metric
    heads = [(t, c) for t in tasks for c in columns]
    sizes = list(data['results'][tasks[0]])
    lines = ['| test resolution | ' + ' | '.join(labels[t] + (f' {c[len(engine) + 1:] or "batch 1"}'
                                                             if len(columns) > 1 else '') for t, c in heads) + ' |',
             '|---|' + '---|' * len(heads)]
    lines += [f'| {size} | ' + ' | '.join(f'{data["results"][t][size][c]:.3f}' for t, c in heads) + ' |'
              for size in sizes]
    flags = '; ' + ', '.join(data['flags']) if data['flags'] else ''
    return '\n'.join(lines) + (
        f'\n\nEngine and precision: {engine}. Pretraining: top-1 {data["pretraining_top1"]:.1f}% on the 400 '
        f'held-out crops. '
        f'`{data["command"]}` (`make demo`, into another folder) trained, evaluated and drew everything in '
        f'{data["minutes"]:.1f} min on {data["cpu"]} ({data["isa"]}{flags}), torch {data["torch"]}, '
        f'{data["jobs"]} tasks at a time after the pretraining (`benchmarks/results/{name}.json`).')


def demo_engines(engines: RecordData, trained: RecordData) -> str:
    """Every engine and precision the summary ``engines`` holds against torch float32 on the checkpoints of the run
    ``trained`` (``engines`` reused them all): the largest absolute difference in bbox mAP and mIoU over the test
    sizes, and where."""
    name, data, source = engines.name, engines.data, _out_dir(trained.data)
    if data['trained'] or _out_dir(data) != source:
        raise ValueError(f'{name}.json is not an evaluation of the trainings of {trained.name}.json '
                         f'(trained now: {data["trained"]}; {_out_dir(data)} against {source})')
    tasks = list(data['results'])
    columns = [c for c in next(iter(data['results'][tasks[0]].values())) if c != DEMO_REFERENCE]
    lines = ['| engine, precision | ' + ' | '.join(f'{data["labels"][t]}: largest change from {DEMO_REFERENCE}'
                                                  for t in tasks) + ' |',
             '|---|' + '---|' * len(tasks)]
    beyond = []
    for column in columns:
        cells = []
        for task in tasks:
            by_size = data['results'][task]
            size = max(by_size, key=lambda k: abs(by_size[k][column] - by_size[k][DEMO_REFERENCE]))
            delta = by_size[size][column] - by_size[size][DEMO_REFERENCE]
            cells.append(f'{delta:+.3f} ({size})')
            if round(abs(delta), 3) > DEMO_TOLERANCE:
                beyond.append(f'{column} ({task})')
        lines.append(f'| {column} | ' + ' | '.join(cells) + ' |')
    verdict = (f'beyond {DEMO_TOLERANCE} of {DEMO_REFERENCE}: {", ".join(beyond)}' if beyond else
               f'every engine and precision within {DEMO_TOLERANCE} of {DEMO_REFERENCE} at every test size')
    return '\n'.join(lines) + f'\n\nFrom `benchmarks/results/{name}.json` (`{data["command"]}`): {verdict}.'


def batch_company(run: RecordData) -> str:
    """The demo's trained models at batch 1 and in padded batches (``benchmarks.batch_company``), each way's
    largest change from batch 1."""
    from benchmarks.batch_company import table as company_table
    name, data = run.name, run.data
    largest = {way: max(abs(r['value'] - base['value']) for r in data['rows'] if r['way'] == way
                        for base in data['rows'] if base['way'] == data['ways'][0] and
                        (base['score'], base['size']) == (r['score'], r['size']))
               for way in data['ways'][1:]}
    return company_table(data) + ' Largest change from batch 1: ' + ', '.join(
        f'{way} {value:.3f}' for way, value in largest.items()) + f' (`benchmarks/results/{name}.json`).'


HEADLINE_STUDY = Study(HEADLINE, 'cpu', complete=('*',))
RECIPE_STUDIES = {recipe: Study(names, EACH) for recipe, names in RECIPES.items()}
ARM_NOTE = ('Top-1 (%) on {test_images} test images, mean ± std over seeds {seeds}, trained on the {device_name}; the '
            'change from {base} px as mean [95% interval], bold where the interval excludes zero. {files}.')


@dataclass(frozen=True)
class Block:
    """One table of the documents (``<!-- verdict:NAME -->``): the ``comparison`` called on its ``inputs`` (keyword
    -> ``Study``, ``Record`` or a mapping of them, loaded by ``load_input``) and ``options``."""
    name: str
    comparison: Callable[..., str]
    inputs: Mapping[str, object]
    options: Mapping[str, object] = field(default_factory=dict)


BLOCKS = (
    Block('headline', changes, dict(s=HEADLINE_STUDY), dict(paper=True, leaders=True, note=(
        'Top-1 (%) on {test_images} Fashion-MNIST test images, mean ± std over seeds {seeds}, every run trained on the '
        "CPU (one thread; the same studies' GPU runs are left out); the change from {base} px as mean [95% interval] "
        'over the seeds, bold where the interval excludes zero. From {files} (benchmarks/results/).'))),
    Block('headline-probe', probe, dict(s=HEADLINE_STUDY), dict(note=(
        'R² of a ridge regression from the final patch tokens to their relative position, fitted at {base} px and '
        'scored on other images at every size; mean ± std over seeds {seeds}, runs trained on the CPU.'))),
    Block('training-size', at_training_size,
          dict(columns={'ours': Study(HEADLINE, 'cpu'),
                        'aliased crops': Study(('resolution_crop_cls_aliased',), 'cpu')}),
          dict(note=f'Top-1 (%) at the training size, mean ± std over seeds {", ".join(map(str, SEEDS))}, every run '
                    'trained on the CPU; the paper: DeiT-tiny on ImageNet. Aliased crops: '
                    '`resolution_crop_cls_aliased.json` (its runs predate the device record; its command names no '
                    '--device, so they trained on the CPU).')),
    Block('paper-pairs', paper_pairs, dict(s=Study(HEADLINE, 'cpu')), dict(gap=0.5)),
    Block('recipes', recipes, dict(recipes=RECIPE_STUDIES), dict(a='peg_0-5', b='learned')),
    Block('control', changes, dict(s=Study(('control_cnn_cpu',), 'cpu', seeds=None)), dict(
        first='model', labels={'cnn': 'CNN, no position encoding (GAP)'}, losing=True, note=(
            'Seeds {seed_list}, trained on the CPU under the default recipe (random resized crops of the 28 px '
            'originals to {base} px, {epochs} epochs); {files}.'))),
    Block('head', head, dict(gap=RECIPE_STUDIES['default (GAP)'], cls=RECIPE_STUDIES['class token'])),
    Block('device', device, dict(recipes={r: RECIPE_STUDIES[r] for r in ('default (GAP)', 'class token')},
                                 tf32_off=Study((TF32_STUDIES['off'],), 'cuda'))),
    Block('tf32', tf32, dict(gpu={m: Study((n,), 'cuda') for m, n in TF32_STUDIES.items()},
                             cpu=Study(RECIPES['default (GAP)'], 'cpu'),
                             recipe=Recipe(RECIPES['default (GAP)'] + tuple(TF32_STUDIES.values())))),
    Block('central', central, dict(s=Study((CENTRAL,), seeds=CENTRAL_SEEDS, complete=('peg_0-5', 'learned'))), dict(
        a='peg_0-5', b='learned', note=(
            'The default recipe (global average pooling), seeds {seeds} fixed before they ran, {test_images} test '
            'images, every run on one GPU with TF32 off; mean ± std, and changes and differences paired by seed as '
            'mean [95% interval], bold where the interval excludes zero. {files}.'))),
    Block('native', native, dict(s=Native('native_checked'))),
    Block('native-windowed', native, dict(s=Native('native_windowed'))),
    Block('native-revalidated', native, dict(s=Native('native_revalidated'))),
    Block('resize-protocol', changes, dict(s=Study(('resolution_resize_cls',))), dict(note=ARM_NOTE)),
    Block('grid14', changes, dict(s=Study(('resolution_crop_grid14_cls',))), dict(probe=True, note=ARM_NOTE)),
    Block('dense', dense, dict(s=Dense('dense_study'))),
    Block('demo', demo, dict(run=Record(DEMO))),
    Block('demo-engines', demo_engines, dict(engines=Record(DEMO_ENGINES), trained=Record(DEMO))),
    Block('batch-company', batch_company, dict(run=Record('batch_company_avx2'))),
)
BLOCK = {block.name: block for block in BLOCKS}


def render(block: Block | str, results: Path = RESULTS) -> str:
    """The one renderer: a block (or its name) from the result files under ``results``."""
    block = BLOCK[block] if isinstance(block, str) else block
    return block.comparison(**{k: load_input(v, results) for k, v in block.inputs.items()}, **block.options)


def headline_figures(results: Path = RESULTS, out: Path = RESULTS) -> list[Path]:
    """The headline's runs trained on the CPU (seeds 0-2) drawn as a study draws its own: top-1 and the change
    per test grid (``verdict_headline.png``), and the position probe (``verdict_headline_probe.png``)."""
    s = load_study(Study(HEADLINE, 'cpu'), results)   # refuses a (variant, seed) trained twice with other results
    meta = s.meta
    cpu = list({(r['variant'], r['seed']): r for r in s.runs if r['device'] == 'cpu' and r['seed'] in SEEDS}.values())
    config = StudyConfig(variants=tuple(v for v in VARIANTS if any(r['variant'] == v for r in cpu)), seeds=SEEDS,
                         image_size=meta['image_size'], test_sizes=tuple(meta['test_sizes']),
                         patch=meta['model']['patch'], head=meta['model']['head'],
                         test_resample=meta['test_resample'])
    paths = [out / 'verdict_headline.png', out / 'verdict_headline_probe.png']
    report.plot(report.summarise(cpu, config), config, paths[0])
    report.plot_probe(report.summarise_probe(cpu, config), config, paths[1])
    return paths


def recipes_figure(results: Path = RESULTS, out: Path = RESULTS, a: str = 'peg_0-5', b: str = 'learned') -> Path:
    """The recipes table drawn (``verdict_recipes.png``): per recipe and training device, ``a`` minus ``b`` at
    the training size and in the change to every larger size, with 95% intervals."""
    cells = list(recipe_cells(load_input(RECIPE_STUDIES, results), a, b))
    plt = pyplot()
    whats = list(cells[0][3])
    fig, axes = plt.subplots(1, len(whats), figsize=(4.2 * len(whats), 4.8), squeeze=False, sharey=False)
    for ax, what in zip(axes[0], whats, strict=True):
        for i, (_, device, _, diffs) in enumerate(cells):
            d = diffs[what]
            low, high = (d['mean'] - d['lo'], d['hi'] - d['mean']) if d['lo'] is not None else (0, 0)
            ax.errorbar(d['mean'], i, xerr=[[low], [high]], fmt='o' if device == 'cpu' else 's', capsize=3,
                        color='black' if d['sign'] != '=' else 'grey')
        ax.axvline(0, color='black', lw=0.8)
        ax.set_yticks(range(len(cells)), [f'{r} ({DEVICES[d]}, seeds {",".join(map(str, s))})'
                                          for r, d, s, _ in cells], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[0][1:]:
        ax.set_yticklabels([])
    fig.suptitle(f'{VARIANTS[a].label} minus {VARIANTS[b].label}, paired by seed (points, 95% interval; black: '
                 'the interval excludes zero; circles CPU, squares GPU)', fontsize=9)
    fig.tight_layout()
    path = out / 'verdict_recipes.png'
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)
    return path


MARKER = re.compile(r'<!-- verdict:(?P<name>[\w-]+) -->\n(?:(?P<body>.*?)\n)?<!-- /verdict:(?P=name) -->', re.S)


def blocks_in(text: str) -> dict[str, str]:
    """The verdict blocks a document holds: name -> body."""
    return {m['name']: m['body'] or '' for m in MARKER.finditer(text)}


def rewrite(text: str, rendered: dict[str, str]) -> str:
    """``text`` with every verdict block's body replaced by its rendering (an unknown name is an error)."""
    unknown = set(blocks_in(text)) - set(rendered)
    if unknown:
        raise ValueError(f'unknown verdict block(s) {sorted(unknown)}; the blocks are {sorted(rendered)}')
    return MARKER.sub(lambda m: f'<!-- verdict:{m["name"]} -->\n{rendered[m["name"]]}\n<!-- /verdict:{m["name"]} -->',
                      text)


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--results', type=Path, default=RESULTS)
    p.add_argument('--write', action='store_true',
                   help='rewrite the blocks in README.md and docs/, and draw the figures (verdict_*.png in --results)')
    args = p.parse_args(argv)
    rendered = {block.name: render(block, args.results) for block in BLOCKS}
    for name, text in rendered.items():
        print(f'<!-- verdict:{name} -->\n{text}\n')
    if args.write:
        for path in DOCUMENTS:
            text = path.read_text()
            if blocks_in(text):
                path.write_text(rewrite(text, rendered))
        headline_figures(args.results, args.results)
        recipes_figure(args.results, args.results)
    return rendered


if __name__ == '__main__':
    main()
