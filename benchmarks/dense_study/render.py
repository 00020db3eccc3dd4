"""The study's report from its runs: mean and spread per task, backbone and test size (``summarise``), each
backbone paired by seed with the first (``paired_differences``), the Markdown tables, the figure, and the files
(``report``)."""
import statistics
from pathlib import Path

from benchmarks.dense_study.design import SCALES, VARIANTS, DenseStudyConfig, label
from benchmarks.study.common import format_paired, mean_std, paired
from benchmarks.study.grid import write_report
from cpvt_backbones.utils import pyplot


def summarise(results: list[dict], settings: DenseStudyConfig) -> list[dict]:
    rows = []
    for task in settings.tasks:
        for variant in settings.variants:
            runs = sorted((r for r in results if r['task'] == task and r['variant'] == variant),
                          key=lambda r: r['seed'])
            for factor in settings.factors:
                values = [r['scores'][factor] for r in runs]
                m, sd = mean_std(values)
                rows.append(dict(task=task, variant=variant, factor=factor, mean=m, std=sd,
                                 per_seed=[round(v, 2) for v in values], seeds=[r['seed'] for r in runs]))
    return rows


def plot(rows: list[dict], settings: DenseStudyConfig, path: Path) -> None:
    plt = pyplot()
    scaled = [f for f in SCALES if f in settings.factors]
    drawn = [f for f in SCALES if f'drawn{f}' in settings.factors]
    fig, axes = plt.subplots(1, len(settings.tasks), figsize=(5.8 * len(settings.tasks), 4.4), squeeze=False)
    for ax, task in zip(axes[0], settings.tasks, strict=False):
        for i, variant in enumerate(settings.variants):
            r = {row['factor']: row for row in rows if row['task'] == task and row['variant'] == variant}
            line = ax.errorbar([float(f) for f in scaled], [r[f]['mean'] for f in scaled],
                               yerr=[r[f]['std'] for f in scaled], marker='o', capsize=3, label=VARIANTS[variant])
            colour = line[0].get_color()
            if drawn:
                ax.errorbar([float(f) * 1.02 for f in drawn], [r[f'drawn{f}']['mean'] for f in drawn],
                            yerr=[r[f'drawn{f}']['std'] for f in drawn], marker='^', ls='--', capsize=3, color=colour)
            if 'native' in r:
                ax.errorbar([3.35 + 0.06 * i], [r['native']['mean']], yerr=[r['native']['std']], marker='s',
                            capsize=3, color=colour)
        ax.axvline(1, color='grey', ls=':', lw=1)
        ax.set_xticks([float(f) for f in scaled] + ([3.4] if 'native' in settings.factors else []))
        ax.set_xticklabels(scaled + (['native'] if 'native' in settings.factors else []))
        ax.set_xlabel('test long side / training long side\nsolid: resized; dashed: drawn at that size')
        ax.set_ylabel(label(task))
        ax.set_title(task)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    start = 'from scratch' if settings.seg_init == 'scratch' else "segmentor from the detector's backbone"
    fig.suptitle(f'shapes data, trained at 1x ({start}); mean +- std over {len(settings.seeds)} seeds', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def paired_differences(rows: list[dict], task: str, settings: DenseStudyConfig) -> dict[str, dict[str, dict]]:
    """For each variant after the first: its paired difference from the first (same seeds;
    ``study.common.paired``: mean and 95% t interval) at 1x and on the mean over the resized test sizes."""
    def per_seed(variant: str, factor: str) -> list[float]:
        (row,) = [r for r in rows if r['task'] == task and r['variant'] == variant and r['factor'] == factor]
        return row['per_seed']

    scaled = [f for f in SCALES if f in settings.factors]
    first, out = settings.variants[0], {}
    for variant in settings.variants[1:]:
        cells = {}
        if '1' in settings.factors:
            cells['1x'] = paired(per_seed(variant, '1'), per_seed(first, '1'))
        if scaled:
            means = [[statistics.mean(vals) for vals in zip(*(per_seed(v, f) for f in scaled), strict=True)]
                     for v in (variant, first)]
            cells['resized mean'] = paired(*means)
        out[variant] = cells
    return out


def paired_lines(rows: list[dict], task: str, settings: DenseStudyConfig) -> list[str]:
    """Markdown lines of ``paired_differences`` (nothing for a single variant)."""
    differences = paired_differences(rows, task, settings)
    if not differences:
        return []
    columns = list(next(iter(differences.values())))
    lines = [f'Paired by seed, minus {VARIANTS[settings.variants[0]]} (mean [95% interval]; a claim only where the '
             'interval excludes zero):', '', '| backbone | ' + ' | '.join(columns) + ' |',
             '|---|' + '---|' * len(columns)]
    lines += [f'| {VARIANTS[v]} | ' + ' | '.join(format_paired(cells[c]) for c in columns) + ' |'
              for v, cells in differences.items()]
    return lines + ['']


def tables(rows: list[dict], settings: DenseStudyConfig) -> str:
    """Per task: every backbone's mean ± std at every test size, then the paired differences."""
    def heading(factor: str) -> str:
        return factor if factor == 'native' else f'drawn {factor[5:]}x' if factor.startswith('drawn') else f'{factor}x'
    lines = []
    for task in settings.tasks:
        lines += [f'**{task}** ({label(task)})', '',
                  '| backbone | ' + ' | '.join(heading(f) for f in settings.factors) + ' |',
                  '|---|' + '---|' * len(settings.factors)]
        for variant in settings.variants:
            r = {row['factor']: row for row in rows if row['task'] == task and row['variant'] == variant}
            lines.append(f'| {VARIANTS[variant]} | ' + ' | '.join(
                f'{r[f]["mean"]:.1f} ± {r[f]["std"]:.1f}' for f in settings.factors) + ' |')
        lines.append('')
        lines += paired_lines(rows, task, settings)
    return '\n'.join(lines)


def report(results: list[dict], settings: DenseStudyConfig, meta: dict) -> list[dict]:
    """NAME.{json,csv,md,png} under ``settings.out`` from every run's record (``results``) and the invocation's
    ``meta`` (``run_meta``'s, the settings and the run time summed over runs added); returns the summary rows."""
    rows = summarise(results, settings)
    meta = dict(meta, seeds=list(settings.seeds), det_iters=settings.det_iters, seg_iters=settings.seg_iters,
                factors=list(settings.factors), num_train=settings.num_train, num_val=settings.num_val,
                run_minutes=round(sum(r['train_seconds'] + r['eval_seconds'] for r in results) / 60, 1))
    table = tables(rows, settings)
    init = 'at random' if settings.seg_init == 'scratch' else 'from the detector backbone of the same variant and seed'
    markdown = (
        table + f'\nMean ± standard deviation over seeds {list(settings.seeds)} on the {settings.num_val} held-out '
        f'images. Iterations: detection {settings.det_iters}, segmentation {settings.seg_iters} (batch 8); segmentor '
        f'initialised {init}. Run time summed over runs (training and evaluation, one thread each): '
        f'{meta["run_minutes"]} min; this invocation: {meta["wall_minutes"]} min of wall time (runs already finished '
        f'are read from their result.json).\n\n'
        f'`{meta["command"]}`\n')
    write_report(settings.out, settings.name, dict(meta=meta, rows=rows, runs=results), markdown, rows,
                 {'': lambda path: plot(rows, settings, path)})
    print(table)
    print(f'[dense] {meta["wall_minutes"]} min; results in {settings.out}')
    return rows
