"""The Fashion-MNIST studies' tables: changes with test size per encoding, the position probe, the training size,
the paper's pairs, the recipes, the head, the training device, TF32 and the central five-seed comparison; and the
result files each reads."""
import itertools
from collections.abc import Mapping, Sequence

from benchmarks.study.common import format_paired, mean_std, paired
from benchmarks.study.config import VARIANTS
from benchmarks.study.summary import DEVICES, SEEDS, Summary
from benchmarks.verdict.tables import cell, change, change_heads, common, leader, loss, size_heading, table

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
# The central comparison with five seeds, fixed before they ran: the default recipe's table and PEGs after blocks
# 0-5, one GPU, TF32 off (the TF32 question's "off" study, seeds 3 and 4 added later on the same kind of GPU).
CENTRAL = 'tf32/recipe_sweep_tf32_off'
CENTRAL_SEEDS = (0, 1, 2, 3, 4)


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
