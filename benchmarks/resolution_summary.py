"""The classification comparison across its arms: the paper's ablation beside ours, and every arm's resolution test.

    python -m benchmarks.resolution_summary [--results DIR] [--arms NAME ...] [--out DIR]

Reads the JSON that ``resolution_study.py`` wrote for each arm (``--arms``, those present) and writes
``resolution_summary.md`` and ``resolution_summary.png``:

* the ablation at the training size: the CPVT paper's DeiT-tiny top-1 and ours (first arm), same order;
* where the paper's ordering holds: every pair of encodings the paper separates by at least ``--paper-gap``
  points, counted as agreeing, reversed or undecided (our two means within ``--noise`` pooled seed standard
  deviations of each other), the reversed and undecided pairs listed, and the rank correlation;
* per arm, each encoding's change from the training size at every test size (paired by seed).
"""
import argparse
import itertools
import json
import math
from pathlib import Path
from collections.abc import Sequence

from cpvt_backbones.utils import pyplot
from benchmarks.study.config import VARIANTS
from benchmarks.study.report import line_style

ROOT = Path(__file__).resolve().parents[1]

ARMS = {  # the JSON under --results (the recipe sweep's cells in its subdirectory) -> how the tables name them
    'resolution_crop_cls': 'crop protocol, class token, 7 x 7',
    'recipe_sweep/recipe_sweep_default': 'crop protocol, GAP, 7 x 7',
    'resolution_crop_cls_aliased': 'crop protocol, class token, 7 x 7, aliased crops',
    'resolution_crop_gap': 'crop protocol, GAP, 7 x 7, aliased crops',
    'resolution_resize_cls': 'resize protocol, class token, 7 x 7',
    'resolution_crop_grid14_cls': 'crop protocol, class token, 14 x 14, aliased crops',
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--results', type=Path, default=ROOT / 'benchmarks/results')
    p.add_argument('--arms', nargs='+', default=list(ARMS))
    p.add_argument('--paper-gap', type=float, default=0.5, help='pairs the paper separates by at least this')
    p.add_argument('--noise', type=float, default=1.0,
                   help='ours undecided when the means differ by less than this many pooled standard deviations')
    p.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results')
    return p.parse_args(argv)


def load_arms(results: Path, names: Sequence[str]) -> dict[str, dict]:
    """The JSON ``resolution_study`` wrote for each named arm found under ``results``."""
    arms = {}
    for name in names:
        path = results / f'{name}.json'
        if path.is_file():
            arms[name] = json.loads(path.read_text())
    if not arms:
        raise SystemExit(f'[summary] none of {list(names)} has results under {results}')
    return arms


def at_training_size(arm: dict) -> dict[str, dict]:
    size = arm['meta']['image_size']
    return {r['variant']: r for r in arm['rows'] if r['test'] == 'resize' and r['size'] == size}


def pair_verdicts(rows: dict[str, dict], gap: float, noise: float) -> list[dict]:
    """For each pair the paper orders by >= ``gap`` points: whether ours orders it the same way, the other way,
    or cannot tell (means closer than ``noise`` pooled standard deviations, or 0.5 points if both are zero)."""
    out = []
    named = [v for v in rows if VARIANTS[v].paper is not None]
    for a, b in itertools.combinations(named, 2):
        pa, pb = VARIANTS[a].paper, VARIANTS[b].paper
        if abs(pa - pb) < gap:
            continue
        hi, lo = (a, b) if pa > pb else (b, a)
        diff = rows[hi]['top1_mean'] - rows[lo]['top1_mean']
        spread = max(math.sqrt((rows[hi]['top1_std'] ** 2 + rows[lo]['top1_std'] ** 2) / 2), 0.5 / noise)
        verdict = 'undecided' if abs(diff) < noise * spread else 'agrees' if diff > 0 else 'reversed'
        out.append(dict(higher=hi, lower=lo, paper_gap=round(abs(pa - pb), 1), ours=round(diff, 2),
                        verdict=verdict))
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=False))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))


def fmt(row: dict, change: bool) -> str:
    if change:
        return f'{row["change_mean"]:+.1f} ± {row["change_std"]:.1f}'
    return f'{row["top1_mean"]:.1f} ± {row["top1_std"]:.1f}'


def write(arms: dict[str, dict], paper_gap: float, noise: float, out: Path) -> str:
    first_name, first = next(iter(arms.items()))
    base = at_training_size(first)
    lines = [f'**Ablation at the training size** (top-1 %, mean ± std over seeds; ours: {ARMS[first_name]}; the '
             'paper: DeiT-tiny on ImageNet)', '',
             '| ' + ' | '.join(['position encoding', 'paper', 'ours'] + [ARMS[n] for n in list(arms)[1:]]) + ' |',
             '|---|---|---|' + '---|' * (len(arms) - 1)]
    others = [at_training_size(a) for a in list(arms.values())[1:]]
    for variant in base:
        paper = VARIANTS[variant].paper
        cells = [fmt(o[variant], False) if variant in o else '' for o in others]
        row = [VARIANTS[variant].label, '—' if paper is None else f'{paper:.1f}', fmt(base[variant], False)] + cells
        lines.append('| ' + ' | '.join(row) + ' |')
    verdicts = pair_verdicts(base, paper_gap, noise)
    counts = {v: sum(p['verdict'] == v for p in verdicts) for v in ('agrees', 'reversed', 'undecided')}
    lines += ['', f'**The paper\'s ordering, pair by pair** (pairs it separates by >= {paper_gap} points; '
              f'ours undecided within {noise:g} pooled std): {counts["agrees"]} agree, {counts["reversed"]} '
              f'reversed, {counts["undecided"]} undecided of {len(verdicts)}.', '']
    named = [v for v in base if VARIANTS[v].paper is not None]
    rho = spearman([VARIANTS[v].paper for v in named], [base[v]['top1_mean'] for v in named])
    lines[-2] += f' Spearman rank correlation of the {len(named)} encodings\' top-1, paper vs ours: {rho:.2f}.'
    for verdict in ('reversed', 'undecided'):
        pairs = [p for p in verdicts if p['verdict'] == verdict]
        if pairs:
            lines.append(f'{verdict}: ' + '; '.join(
                f'{VARIANTS[p["higher"]].label} > {VARIANTS[p["lower"]].label} (paper +{p["paper_gap"]}, ours '
                f'{p["ours"]:+.1f})' for p in pairs))
            lines.append('')
    for name, arm in arms.items():
        meta = arm['meta']
        size = meta['image_size']
        sizes = [s for s in meta['test_sizes'] if s != size]
        lines += [f'**{ARMS.get(name, name)}**: change from {size} px (top-1 points, paired by seed); '
                  f'`{meta["command"]}`', '',
                  f'| position encoding | {size} px | ' + ' | '.join(f'{s} px ({s / size:.2g}x)' for s in sizes) + ' |',
                  '|---|---|' + '---|' * len(sizes)]
        rows = {(r['variant'], r['size']): r for r in arm['rows'] if r['test'] == 'resize'}
        for variant in dict.fromkeys(r['variant'] for r in arm['rows']):
            lines.append(f'| {VARIANTS[variant].label} | {fmt(rows[(variant, size)], False)} | ' +
                         ' | '.join(fmt(rows[(variant, s)], True) for s in sizes) + ' |')
        lines.append('')
    text = '\n'.join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'resolution_summary.md').write_text(text + f'\n`python -m benchmarks.resolution_summary '
                                               f'--paper-gap {paper_gap:g} --noise {noise:g}`\n')
    plot(arms, out / 'resolution_summary.png')
    return text


def plot(arms: dict[str, dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(arms), figsize=(4.6 * len(arms), 4.2), squeeze=False, sharey=True)
    for ax, (name, arm) in zip(axes[0], arms.items(), strict=False):
        size = arm['meta']['image_size']
        for variant in dict.fromkeys(r['variant'] for r in arm['rows']):
            rows = sorted((r for r in arm['rows'] if r['variant'] == variant and r['test'] == 'resize'),
                          key=lambda r: r['size'])
            ax.errorbar([r['size'] / size for r in rows], [r['change_mean'] for r in rows],
                        yerr=[r['change_std'] for r in rows], capsize=2, label=VARIANTS[variant].label,
                        **line_style(variant, plt))
        ax.axhline(0, color='black', lw=0.8)
        ax.set_title(ARMS.get(name, name), fontsize=9)
        ax.set_xlabel('test size / training size')
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('top-1 change from the training size (points)')
    labels = {}  # every encoding once, in VARIANTS order, with the same colour and line in every panel
    for ax in axes[0]:
        labels.update(zip(*reversed(ax.get_legend_handles_labels()), strict=False))
    order = [v.label for v in VARIANTS.values() if v.label in labels]
    fig.legend([labels[k] for k in order], order, loc='center left', bbox_to_anchor=(1, 0.5), fontsize=8)
    fig.suptitle('Fashion-MNIST, tested without fine-tuning; mean ± std over seeds', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> str:
    args = parse_args(argv)
    text = write(load_arms(args.results, args.arms), args.paper_gap, args.noise, args.out)
    print(text)
    return text


if __name__ == '__main__':
    main()
