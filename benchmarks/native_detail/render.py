"""The study's report rendered from its summary (``selection.summarise``), config and meta: the Markdown tables
(``render_markdown``) and the figure of the headline analysis (``plot``)."""
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.native_detail.design import BASE, MATCH_WITHIN, TRAIN_SIZE, claimed_keys, test_keys
from benchmarks.native_detail.selection import MATCHES
from benchmarks.study.common import format_paired
from benchmarks.study.config import VARIANTS, StudyConfig
from benchmarks.study.report import line_style
from benchmarks.study.specs import Drawn, parse_key
from cpvt_backbones.utils import pyplot


def heading(key: str) -> str:
    """A test's column heading: 'drawn 96 px (1.7x)', '56 px drawing resized to 96 px (1.7x)'."""
    test = parse_key(key)
    kind = 'drawn' if isinstance(test, Drawn) else f'{TRAIN_SIZE} px drawing resized to'
    return f'{kind} {test.size} px ({test.size / TRAIN_SIZE:.2g}x)'


def _levels_table(analysis: dict, variants: Sequence[str]) -> list[str]:
    keys = test_keys()
    lines = ['| model | epoch | validation | ' + ' | '.join(
        heading(k) + ('' if k in claimed_keys() or k == BASE else ' (no claim)') for k in keys) + ' |',
        '|---|---|---|' + '---|' * len(keys)]
    for variant in variants:
        rows = [r for r in analysis['rows'] if r['variant'] == variant]
        cells = []
        for row in rows:
            cell = f'{row["top1_mean"]:.2f} ± {row["top1_std"]:.2f}'
            if 'change' in row:
                cell += f' ({format_paired(row["change"])}; {row["error_share"]["mean"]:+.0f}% of the error)'
            cells.append(cell)
        lines.append(f'| {VARIANTS[variant].label} | {np.mean(rows[0]["epochs"]):.2f} | {rows[0]["val_mean"]:.2f} | '
                     + ' | '.join(cells) + ' |')
    return lines


def _pairs_table(analysis: dict) -> list[str]:
    keys = [BASE, *claimed_keys()]
    lines = ['| A − B | ' + ' | '.join(f'top-1 at {TRAIN_SIZE} px' if k == BASE else f'change to {heading(k)}'
                                      for k in keys) + ' |', '|---|' + '---|' * len(keys)]
    pairs = [(p['a'], p['b']) for p in analysis['pairs'] if p['test'] == BASE]
    for a, b in pairs:
        entries = {p['test']: p for p in analysis['pairs'] if (p['a'], p['b']) == (a, b)}
        cells = [(lambda d: f'{format_paired(d)}{" =" if d["sign"] == "=" else ""}')(
            entries[k]['top1'] if k == BASE else entries[k]['change']) for k in keys]
        lines.append(f'| {a} − {b} | ' + ' | '.join(cells) + ' |')
    return lines


def _leaders(analysis: dict) -> str:
    out = []
    for key, lead in analysis['leaders'].items():
        label = VARIANTS[lead['variant']].label
        out.append(f'{heading(key)}: {label} gains most, separated from every other variant' if lead['separated']
                   else f'{heading(key)}: no leader ({label} gains most on average, tied with '
                   f'{", ".join(lead["tied_with"])})')
    return '; '.join(out) + '.'


def _scene_set(meta: dict) -> str:
    return (f' (set {meta["test_seed"]}, drawn for this analysis: none of {meta["source"]}\'s test scenes)'
            if meta.get('source') else '')


def _validation(meta: dict) -> str:
    return (f'; the checks selected instead on validation set {meta["val_seed"]}: {meta["val_images"]} scenes drawn '
            f'at {TRAIN_SIZE} px as the tests are, none of them a test scene'
            if meta.get('val_seed') is not None else '')


def _cost(meta: dict) -> str:
    return (' (their ' + ('validation and ' if meta.get('val_seed') is not None else '')
            + f'tests; the training is {meta["source"]}\'s)' if meta.get('source') else '')


def _trained(meta: dict) -> str:
    return ('; the weights trained by ' + ', '.join(f'{study} at commit {commit}, torch {version}'
                                                    for study, commit, version in meta['trained'])
            if meta.get('trained') else '')


def render_markdown(summary: dict, config: StudyConfig, meta: dict) -> str:
    """The report: both analyses (the headline first), each with its table of top-1 and changes per variant, its
    table of paired differences and its leaders; the object scales, the replaced runs and the set-up."""
    headline = summary['headline']
    per_epoch = meta.get('checks_per_epoch', 1)
    smooth = summary['smooth']
    reading = ('validation top-1' + (f' on set {meta["val_seed"]}' if meta.get('val_seed') is not None else '')
               + (f' (mean of {smooth} consecutive checks)' if smooth > 1 else ''))
    lines = []
    width = summary.get('window', 1)
    averaged = f'; tests averaged over the {width} checks centred there, fewer at the end' if width > 1 else ''
    for name in (headline, 'matched' if headline == 'final' else 'final'):
        analysis = summary['analyses'][name]
        title = (f'Final epoch{f" ({averaged[2:]})" if averaged else ""}' if name == 'final' else
                 'Matched checkpoints (per run '
                 + MATCHES[summary.get('match', 'first')].text.format(reading=reading, level=f'{summary["level"]:.2f}')
                 + (f', fixed before any test; the rule over all runs gives {summary["level_rule"]:.2f}'
                    if summary.get('level_fixed') else '')
                 + f'; {per_epoch} check{"s" if per_epoch > 1 else ""} an epoch{averaged})')
        lines += [f'**{title}**{" (the headline)" if name == headline else ""}: the position variants start '
                  f'{analysis["start_spread"]:.2f} points apart at {TRAIN_SIZE} px.', '',
                  *_levels_table(analysis, config.variants), '', *_pairs_table(analysis), '',
                  f'Leaders: {_leaders(analysis)}', '']
    scales = meta['object_scales']
    lines += ['Apparent object radius (px), percentiles ' + '/'.join(map(str, scales['levels'])) + ': training crops '
              + ' / '.join(map(str, scales['crops'])) + '; ' + '; '.join(
                  f'{heading(k)} ' + ' / '.join(map(str, t['percentiles'])) + f' (share of training objects '
                  f'smaller than its median: {t["crop_share_below"]:.2f})' for k, t in scales['tests'].items()) + '.',
              '', *(line for reason in meta.get('replaced', ()) for line in (f'Replaced: {reason}.', ''))]
    return '\n'.join(lines) + (
        f'\nTop-1 (%) on {config.test_images} held-out scenes{_scene_set(meta)}, mean ± standard deviation over '
        f'seeds {list(config.seeds)}; in brackets the change from {TRAIN_SIZE} px paired by seed with its 95% '
        f'interval, and the change as a share of the remaining error at {TRAIN_SIZE} px. A − B: paired differences '
        f'in the change (in top-1 for the first column); `=`: the interval includes zero. The headline analysis is '
        f'"final" where the position variants\' mean final validation top-1 lie within {MATCH_WITHIN:.0f} points '
        f'(here {summary["final_val_spread"]:.2f} apart); "epoch": the epochs done at the chosen checks (mean over '
        f'seeds); "validation": the {reading} there. Trained on {config.train_images} fields '
        f'({meta["val_fields"]} more held out for validation{_validation(meta)}), log-uniform crops (area '
        f'{config.crop_scale}-1) to '
        f'{TRAIN_SIZE} px, a shared convolutional stem of stride {config.patch} ({TRAIN_SIZE // config.patch} x '
        f'{TRAIN_SIZE // config.patch} tokens), global average pooling, {config.dim} wide, depth {config.depth}, '
        f'{config.epochs} epochs ({meta["iterations"]} iterations) on {meta["trained_on"]}, torch '
        f'{", ".join(meta["torch"])}, commit {", ".join(c[:10] for c in meta["commits"])}{_trained(meta)}. '
        f'Parameters: '
        f'{meta["params"]}. Run time summed over the runs{_cost(meta)}: {meta["run_minutes"]} min; this invocation: '
        f'{meta["wall_minutes"]} min.\n\n`{meta["command"]}`\n')


def plot(summary: dict, config: StudyConfig, path: Path) -> None:
    """The headline analysis drawn to ``path``: top-1 and its change from 56 px per drawn test size and variant."""
    plt = pyplot()
    analysis = summary['analyses'][summary['headline']]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for variant in config.variants:
        rows = [r for r in analysis['rows'] if r['variant'] == variant and isinstance(parse_key(r['test']), Drawn)]
        sizes = [parse_key(r['test']).size for r in rows]
        axes[0].errorbar(sizes, [r['top1_mean'] for r in rows], yerr=[r['top1_std'] for r in rows], capsize=3,
                         label=VARIANTS[variant].label, **line_style(variant, plt))
        change = [0.] + [r['change']['mean'] for r in rows[1:]]
        err = [0.] + [r['change']['mean'] - r['change']['lo'] if r['change']['lo'] is not None else 0.
                      for r in rows[1:]]
        axes[1].errorbar(sizes, change, yerr=err, capsize=3, label=VARIANTS[variant].label, **line_style(variant, plt))
    axes[0].set_ylabel('top-1 (%), mean ± sd')
    axes[1].set_ylabel(f'change in top-1 from {TRAIN_SIZE} px (points, 95% interval)')
    axes[1].axhline(0, color='grey', lw=0.8)
    for ax in axes:
        ax.set_xlabel(f'test size (px), drawn natively; trained at {TRAIN_SIZE} px')
    axes[0].legend(fontsize=7)
    fig.suptitle(f'{summary["headline"]} analysis', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
