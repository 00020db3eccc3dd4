"""The study's report: each analysis as Markdown (``render_markdown``), the gain-against-start curves
(``plot``), and the report's files written from committed code, from runs of one protocol on one accelerator
(``write_outputs``)."""
import json
from collections.abc import Sequence
from pathlib import Path

from benchmarks.confirm_detail.analysis import pilot_choice, summarise
from benchmarks.confirm_detail.decision import PAPER
from benchmarks.confirm_detail.protocol import TAG, Protocol
from benchmarks.study.common import format_paired
from benchmarks.study.config import VARIANTS
from benchmarks.study.grid import write_report
from benchmarks.study.records import committed, one_accelerator
from benchmarks.study.report import line_style
from cpvt_backbones.utils import pyplot


def heading(key: str) -> str:
    kind, size = ('native', int(key[6:])) if key.startswith('native') else ('upsampled', int(key[9:]))
    return f'{"drawn" if kind == "native" else "1x drawing upsampled to"} {size} px'


def _ms(pair: tuple[float, float]) -> str:
    return f'{pair[0]:.2f} ± {pair[1]:.2f}'


def _holm(c: dict) -> str:
    if c['holm_lo'] is None:
        return f'{c["mean"]:+.2f}'
    return f'{c["mean"]:+.2f} [{c["holm_lo"]:+.2f}, {c["holm_hi"]:+.2f}]'


def _contrast_name(c: dict) -> str:
    what = {'detail': 'gain from detail', 'scale': 'gain from scale', 'change': 'change', 'start': 'top-1 at start',
            'val': 'validation top-1'}[c['measure']]
    at = f' at {c["size"]} px' if c['measure'] not in ('start', 'val') else ''
    return f'{what}{at}: {c["a"]}' + (f' − {c["b"]}' if c.get('b') else '')


def scales_text(scales: dict) -> str:
    """``object_scales`` as one paragraph."""
    return ('Apparent object radius (px), percentiles ' + '/'.join(map(str, scales['levels'])) + ': training crops '
            + ' / '.join(map(str, scales['crops'])) + f' ({scales["empty_crops"]:.1%} of crops show no object); '
            + '; '.join(f'{heading(k)} ' + ' / '.join(map(str, t['percentiles'])) + ' (share of crop objects '
                        f'smaller than its median: {t["crop_share_below"]:.2f})' for k, t in scales['tests'].items())
            + '.')


def _interval(d: dict, level: float | None = None) -> str:
    return f'{d["mean"]:+.2f} [{d["lo"]:+.2f}, {d["hi"]:+.2f}]' + (f' ({level:.0%})' if level else '')


def render_decision(decided: dict, contrast: dict) -> str:
    """The primary contrast's decision (``decision.decide``) and the power the protocol planned for each rule."""
    rule = decided['rule']
    sup, eq = rule['superiority'], rule['equivalence']
    text = (f'**Primary contrast** ({_contrast_name(contrast)}; the rules fixed in the protocol before its runs: '
            f'superiority where its {sup["confidence"]:.0%} interval lies above {sup["above"]:g}, equivalence where '
            f'its {eq["confidence"]:.0%} interval lies within ±{eq["margin"]:g} points, inferiority where its '
            f'{sup["confidence"]:.0%} interval lies below {-sup["above"] + 0.:g}, otherwise undecided): '
            f'**{decided["verdict"]}**')
    if decided['wide']['lo'] is not None:
        text += (f' ({_interval(decided["wide"], sup["confidence"])}; {_interval(decided["narrow"], eq["confidence"])};'
                 f' {decided["wide"]["n"]} seeds)')
    plan = rule.get('power')
    if plan:
        text += (f'. Its planned power: superiority {plan["superiority"]:.0%} were the true difference '
                 f'{plan["effect"]:+g}, equivalence {plan["equivalence"]:.0%} were it 0 ({plan["basis"]})')
    return text + '.'


def render_hindsight(h: dict) -> str:
    """What a study's runs say it could decide (``decision.hindsight``), as one paragraph."""
    paper, detail = h['paper'], h['detail']
    covers = [v for v in (0., h['effect']) if paper['lo'] <= v <= paper['hi']]
    return (f"**What the study could decide** (computed after the runs from their spread; no claim): were the PEG's "
            f"gain from detail at {h['size']} px truly {h['effect']:+g} points more than the table's (the paper's "
            f"difference: CPVT-Ti {PAPER['peg'][0]} → {PAPER['peg'][1]} from {PAPER['sizes'][0]} to "
            f"{PAPER['sizes'][1]} px, DeiT-tiny {PAPER['table'][0]} → {PAPER['table'][1]}), the contrast's 95% "
            f"interval would have excluded zero on that side with probability {h['power']:.1%} unadjusted and "
            f"{h['power_holm']:.1%} at Holm's first step over its {h['family']} contrasts (a "
            f"{h['holm_level']:.2%} interval: the level a contrast is tested at unless another is rejected before "
            f"it); the true SD taken as the one across its {h['n']} seeds ({h['sd']:.2f} points), the power from "
            f"the noncentral t distribution. The data bound the PEG's extra gain from detail over the table at "
            f"{h['bound']:+.2f} points (the upper end of its unadjusted 95% interval, {_interval(detail)}). "
            f"The paper's own measure, the change from the training size to {h['size']} px, PEG minus table: "
            f"{_interval(paper)} (95%, unadjusted)"
            + (f", an interval covering {' and '.join(f'{v:+g}' if v else '0' for v in covers)}" if covers else '')
            + '.')


def render_summary(summary: dict, protocol: Protocol, arms: Sequence[str]) -> list[str]:
    """One analysis as Markdown lines: the learning, ceiling and control rules, the final-epoch table, the
    contrasts, the claims, the primary contrast's decision and what the runs could decide."""
    rule = summary['learns']
    lines = []
    if rule and rule['gaps']:
        lines += [f'**Every arm learns the task** (validation top-1 at {protocol.train_size} px, final epoch, mean '
                  f'over seeds; {rule["reference"]} at least {rule["reference_min"]:.0f}, '
                  f'{", ".join(rule["arms"])} within {rule["within"]:.0f} points of it): '
                  + ('holds' if rule['holds'] else 'does not hold')
                  + f' ({rule["reference"]} {rule["reference_val"]:.2f}; gaps: '
                  + ', '.join(f'{a} {g:+.2f}' for a, g in rule['gaps'].items()) + ').', '']
    top = summary.get('ceiling')
    if top and top['tops']:
        lines += [f'**Clear of the ceiling** ({", ".join(top["arms"])} below {top["below"]:.0f} at {top["size"]} px, '
                  'native and upsampled, final epoch, mean over seeds): ' + ('holds' if top['clear'] else
                                                                              'does not hold')
                  + ' (' + ', '.join(f'{a} {t:.2f}' for a, t in top['tops'].items()) + ').', '']
    control = summary.get('control')
    if control:
        lines += [f'**The control at the transformers\' accuracy** ({control["arm"]}\'s top-1 drawn at '
                  f'{protocol.train_size} px, final epoch, mean over seeds, within {control["within"]:g} points of '
                  f'{control["target"]:g}): ' + ('holds' if control['holds'] else 'does not hold')
                  + f' ({control["start"]:.2f}, {control["distance"]:+.2f}).', '']
    sizes = protocol.upsampled
    lines += [f'| arm | validation | training top-1 | drawn {protocol.train_size} px (start) | '
              + ' | '.join(f'{s} px: native / upsampled | {s} px: gain from detail | {s} px: gain from scale'
                           for s in sizes) + ' |', '|---|---|---|---|' + '---|---|---|' * len(sizes)]
    for a in arms:
        row = summary['arms'][a]
        cells = []
        for r in (r for r in summary['rows'] if r['arm'] == a):
            cells += [f'{_ms(r["native"])} / {_ms(r["upsampled"])}', format_paired(r['detail']),
                      format_paired(r['scale'])]
        lines.append(f'| {VARIANTS[a].label} | {_ms(row["val"])} | {_ms(row["train_top1"])} | {_ms(row["start"])} | '
                     + ' | '.join(cells) + ' |')
    contrasts = summary['contrasts']
    family = [c for c in contrasts.values() if not c['secondary']]
    if contrasts:
        over = (f'Holm over these {len(contrasts)}' if len(family) == len(contrasts) else
                f'Holm over {", ".join(c["id"] for c in family)}; the others secondary, unadjusted, no claim')
        lines += ['', f'**Contrasts** (paired by seed; {over}):', '',
                  '| contrast | per seed | mean [95%] | Holm-adjusted [interval] | p | p (Holm) |',
                  '|---|---|---|---|---|---|']
        for c in contrasts.values():
            p = '' if c['p'] is None else f'{c["p"]:.4f}'
            lines.append(f'| {_contrast_name(c)} | {", ".join(f"{v:+.2f}" for v in c["per_seed"])} | '
                         f'{format_paired(c)} | {_holm(c)}{" =" if c["sign"] == "=" else ""} | {p} | '
                         f'{c["p_holm"]:.4f} |')
    if summary['claims']:
        lines += ['', '**Claims** (each holds only where its Holm-adjusted interval excludes zero on its side):', '']
        lines += [f'* {c["text"]} **{c["verdict"]}** ({_contrast_name(contrasts[c["contrast"]])}: '
                  f'{_holm(contrasts[c["contrast"]])}).' for c in summary['claims']]
    if summary.get('decision'):
        lines += ['', render_decision(summary['decision'], contrasts[summary['decision']['rule']['contrast']])]
    if summary.get('hindsight'):
        lines += ['', render_hindsight(summary['hindsight'])]
    return lines


def _flags(summary: dict, clear: bool) -> str:
    """What keeps a pilot candidate from qualifying besides its gaps: its reference short of its level, the
    ceiling."""
    rule, flags = summary['learns'], []
    if not rule['reference_learns']:
        flags.append(f'{rule["reference"]} short of {rule["reference_min"]:.0f}')
    if not clear:
        flags.append('at the ceiling')
    return f' ({", ".join(flags)})' if flags else ''


def render_markdown(document: dict, protocol: Protocol) -> str:
    meta = document['meta']
    lines = [f'Protocol `{meta["protocol"]}` (sha256 {meta["protocol_sha256"][:12]}, {meta["status"]}); '
             f'{"pilot" if meta["pilot"] else "confirmatory"} study `{meta["name"]}`, seeds {meta["seeds"]}.', '']
    if meta['pilot'] and 'distances' in document['choice']:
        choice, rule = document['choice'], protocol.control
        lines += [f'**The recipe the pilot fixes**: {choice["candidate"]} ('
                  + (f'its control within {rule["within"]:g} points of {rule["target"]:g}, clear of the ceiling'
                     if choice['holds'] else 'no candidate\'s control lies within '
                     f'{rule["within"]:g} points of {rule["target"]:g} clear of the ceiling: the nearest')
                  + '; its top-1 drawn at the training size less the target per candidate: '
                  + ', '.join(f'{c} {g:+.2f}' + ('' if choice['clear'][c] else ' (at the ceiling)')
                              for c, g in choice['distances'].items()) + ').', '']
    elif meta['pilot']:
        choice = document['choice']
        lines += [f'**The recipe the pilot fixes**: {choice["candidate"]} ('
                  + ('its learning rule holds, clear of the ceiling' if choice['holds'] else 'no candidate\'s '
                     'learning rule holds clear of the ceiling: the smallest largest gap') + '; largest gap per '
                  'candidate: ' + ', '.join(f'{c} {g:+.2f}' + _flags(document['summaries'][c], choice['clear'][c])
                                            for c, g in choice['gaps'].items()) + ').', '']
    else:
        lines += [f'Recipe: `{json.dumps(protocol.recipe())}`.', '']
    for candidate, summary in document['summaries'].items():
        if meta['pilot']:
            lines += [f'### Candidate `{candidate}`: `{json.dumps(protocol.recipe(candidate))}`', '']
        lines += [*render_summary(summary, protocol, meta['arms']), '',
                  scales_text(meta['object_scales'][candidate]), '']
    lines += [f'Top-1 (%) at the final epoch (no check selected) on {meta["test_images"]} held-out scenes (scene set '
              f'{meta["test_set"]}), mean ± standard deviation over seeds; validation on {meta["validation_images"]} '
              f'scenes of set {meta["validation_set"]} drawn at {protocol.train_size} px. Gain from detail: drawn '
              f'natively minus the {protocol.train_size} px drawing upsampled, gain from scale: upsampled minus drawn '
              f'at {protocol.train_size} px, each paired by seed with its 95% interval; `=`: the adjusted interval '
              f'includes zero. Trained on {meta["train_fields"]} fields of set {meta["train_set"]}, '
              f'{", ".join(map(str, meta["iterations"]))} iterations, on {meta["accelerator"]}, torch '
              f'{", ".join(meta["torch"])}; runs at commit {", ".join(c[:10] for c in meta["run_commits"])}; '
              f'rendered at commit '
              f'{meta["rendered_at"][:10]}. Parameters: {meta["params"]}. Run time summed over the runs: '
              f'{meta["run_minutes"]} min (training {meta["train_minutes"]}, checks {meta["check_minutes"]}).',
              '', f'`{meta["command"]}`', '']
    return '\n'.join(lines)


def plot(document: dict, protocol: Protocol, path: Path, candidate: str) -> None:
    """Each arm's gain from detail (top) and change (bottom) against its start, one point per check (mean over
    seeds), per upsampled size; the final check ringed."""
    plt = pyplot()
    summary, sizes = document['summaries'][candidate], protocol.upsampled
    fig, axes = plt.subplots(2, len(sizes), figsize=(4.2 * len(sizes), 7.4), squeeze=False)
    for row, (key, label) in enumerate((('detail', 'gain from detail: native − upsampled'),
                                        ('change', f'change from {protocol.train_size} px, native'))):
        for ax, s in zip(axes[row], sizes, strict=True):
            for i, (a, points) in enumerate(summary['curves'].items()):
                style = dict(line_style(a, plt), color=plt.cm.tab10(i % 10))
                xs, ys = [p['start'] for p in points], [p[key][str(s)] for p in points]
                ax.plot(xs, ys, label=VARIANTS[a].label, **style)
                ax.plot(xs[-1:], ys[-1:], marker='o', ms=10, mfc='none', color=style['color'])
            ax.axhline(0, color='grey', lw=0.8)
            ax.set_title(f'{label}, {s} px', fontsize=9)
            ax.set_xlabel(f'start: top-1 drawn at {protocol.train_size} px (%)')
            ax.set_ylabel('points')
            ax.grid(alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc='center left', bbox_to_anchor=(1, 0.5), fontsize=8)
    fig.suptitle(f'{document["meta"]["name"]}: one point per check (every epoch), mean over seeds; the final '
                 'epoch ringed', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def report_arms(protocol: Protocol, pilot: bool) -> tuple[str, ...]:
    """The arms a report compares: the pilot's, or the confirmatory grid's."""
    return tuple(protocol['pilot']['arms']) if pilot else protocol.arms


def analyse(results: dict[str, list[dict]], protocol: Protocol, pilot: bool) -> dict:
    """A report's analyses from its runs (``results``: {candidate or '': runs}): each candidate's final-epoch
    ``summarise`` ('summaries') and, for a pilot, the recipe it fixes ('choice', ``pilot_choice``)."""
    summaries = {c: summarise(rs, protocol, report_arms(protocol, pilot)) for c, rs in results.items()}
    return dict(summaries=summaries, choice=pilot_choice(summaries)) if pilot else dict(summaries=summaries)


def write_outputs(results: dict[str, list[dict]], protocol: Protocol, pilot: bool, out: Path, meta: dict,
                  root: Path | None = None) -> dict:
    """The study's report (NAME.json, .md, .csv and, where every epoch is checked, a figure per candidate) from
    ``results`` ({candidate or '': runs}), rendered only from a clean tree at ``root`` (``records.committed``; the
    rendering commit is recorded apart from the runs'), from runs on one accelerator under this protocol."""
    rendered_at, _ = committed(root, 'render a report')
    runs = [r for rs in results.values() for r in rs]
    other = sorted({f'{r["variant"]} seed {r["seed"]}' for r in runs if r['protocol_sha256'] != protocol.sha256})
    if other:
        raise SystemExit(f'[{TAG}] runs of another protocol than {protocol.path}: {", ".join(other)}')
    accelerator = one_accelerator(runs, TAG)
    analysed = analyse(results, protocol, pilot)
    d = protocol['data']
    meta = dict(meta, protocol=runs[0]['protocol'], protocol_sha256=protocol.sha256, status=protocol.status,
                pilot=pilot, name=protocol['pilot']['name'] if pilot else protocol['name'],
                arms=list(report_arms(protocol, pilot)),
                seeds=sorted({r['seed'] for r in runs}), accelerator=accelerator,
                torch=sorted({r['torch'] for r in runs}), run_commits=sorted({r['commit'] for r in runs}),
                rendered_at=rendered_at, iterations=sorted({r['iterations'] for r in runs}),
                params={r['variant']: r['params'] for r in runs}, train_fields=d['train_fields'],
                train_set=d['scene_sets']['train'], validation_set=d['scene_sets']['validation'],
                validation_images=d['validation_images'], test_images=d['test_images'],
                test_set=d['scene_sets']['pilot_test' if pilot else 'test'],
                train_minutes=round(sum(r['train_seconds'] for r in runs) / 60, 1),
                check_minutes=round(sum(r['eval_seconds'] for r in runs) / 60, 1))
    meta['run_minutes'] = round(meta['train_minutes'] + meta['check_minutes'], 1)
    document = dict(meta=meta, protocol=protocol.data, **analysed, runs=runs)
    summaries = analysed['summaries']
    rows = [dict(candidate=c, arm=r['arm'], size=r['size'], native=r['native'][0], upsampled=r['upsampled'][0],
                 detail=format_paired(r['detail']), scale=format_paired(r['scale']), change=format_paired(r['change']))
            for c, s in summaries.items() for r in s['rows']]
    figures = {(f'_{c}' if pilot else ''): (lambda path, c=c: plot(document, protocol, path, c)) for c in summaries
               if protocol.checks_per_epoch}   # a study checking its final epoch alone has no curves to draw
    write_report(out, meta['name'], document, render_markdown(document, protocol), rows, figures)
    return document
