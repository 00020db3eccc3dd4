"""Which checks of each run the analyses read, from validation alone (``select``, ``run_checks``, ``MATCHES``),
and what they find there (``summarise``): per variant and test the top-1 and its change from 56 px, per pair of
variants the paired differences, per larger test the leader."""
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.native_detail.design import BASE, MATCH_WITHIN, claimed_keys, test_keys
from benchmarks.study.common import mean_std, paired
from benchmarks.study.config import VARIANTS, StudyConfig


def checks_of(result: dict) -> tuple[list[dict], dict[str, dict]]:
    """A run's checks (``[{check, epoch, val}]``) and tests (``{str(check): {test key: top-1}}``); a run of the
    per-epoch form (``native_matched``: validation and every test after each epoch, in its log) reads as one
    check per epoch; a record without tests (``revalidate``'s) as none."""
    if 'checks' in result:
        return result['checks'], result.get('tests', {})
    return ([dict(check=e['epoch'], epoch=e['epoch'], val=e['val']) for e in result['log']],
            {str(e['epoch']): e['top1'] for e in result['log']})


def centred(i: int, width: int) -> slice:
    """The ``width`` (odd) consecutive positions centred on position ``i``, fewer at the ends."""
    return slice(max(0, i - width // 2), i + width // 2 + 1)


def smoothed(values: Sequence[float], width: int) -> list[float]:
    """The centred mean over ``width`` (odd) consecutive values (``centred``)."""
    return [float(np.mean(values[centred(i, width)])) for i in range(len(values))]


def window(checks: Sequence[dict], check: int, width: int) -> list[int]:
    """The ids of the ``width`` (odd) consecutive checks centred on ``check`` (``centred``): the checks whose mean
    validation top-1 the selection read there (``smoothed``)."""
    ids = [c['check'] for c in checks]
    return ids[centred(ids.index(check), width)]


def window_tests(result: dict, check: int, width: int) -> dict[str, float]:
    """A run's mean of each test's top-1 over the ``width`` checks centred on ``check`` (``window``); a KeyError
    names a check without tests."""
    checks, tests = checks_of(result)
    ids = window(checks, check, width)
    return {k: float(np.mean([tests[str(i)][k] for i in ids])) for k in tests[str(check)]}


def window_val(result: dict, check: int, width: int) -> float:
    """A run's mean validation top-1 over the ``width`` checks centred on ``check`` (``window``)."""
    checks = checks_of(result)[0]
    ids = window(checks, check, width)
    return float(np.mean([c['val'] for c in checks if c['check'] in ids]))


def first_reaching(vals: Sequence[float], level: float) -> int:
    """The index of the first value that reaches ``level``; of the largest where none does."""
    reached = [i for i, v in enumerate(vals) if v >= level - 1e-9]
    return reached[0] if reached else int(np.argmax(vals))


def nearer_crossing(vals: Sequence[float], level: float) -> int:
    """Of the first value that reaches ``level`` (``first_reaching``) and the one before it, the index of the one
    nearer to ``level`` (the first on a tie)."""
    i = first_reaching(vals, level)
    return i - 1 if i > 0 and vals[i] >= level - 1e-9 and level - vals[i - 1] < vals[i] - level else i


@dataclass(frozen=True)
class Match:
    """A rule for the matched checks: ``level`` gives L from the position variants' best smoothed validation
    top-1 per run (``{variant: [best per seed]}``); ``pick`` gives a run's matched check (an index) from its
    smoothed validation curve and L; ``text`` says which check that is in the report ({reading}, {level})."""
    level: Callable[[dict[str, list[float]]], float]
    pick: Callable[[Sequence[float], float], int]
    text: str


MATCHES = {
    'first': Match(lambda best: min(float(np.mean(b)) for b in best.values()), first_reaching,
                   'the first check whose {reading} reaches {level}'),
    'nearest': Match(lambda best: min(min(b) for b in best.values()), nearer_crossing,
                     'where its {reading} first reaches {level} (the lowest of the position variants\' runs\' best, '
                     'so that each of them reaches it), that check or the one before, whichever lies nearer'),
}


def run_checks(checks: Sequence[dict], smooth: int, level: float, match: str = 'first') -> dict[str, int]:
    """A run's 'final' check (its last) and 'matched' check (``MATCHES[match].pick`` on its validation top-1
    smoothed over ``smooth`` checks, with ``level``: for 'first' the first check to reach it, its best where none
    does), from ``checks`` (``[{check, val}]``)."""
    vals = smoothed([c['val'] for c in checks], smooth)
    return dict(final=checks[-1]['check'], matched=checks[MATCHES[match].pick(vals, level)]['check'])


def select(results: list[dict], variants: Sequence[str], smooth: int, level: float | None = None,
           match: str = 'first') -> dict:
    """The two analyses' check per run (``{(variant, seed): check}``), the matched level (``level`` where given,
    else the rule's, ``MATCHES[match].level``: for 'first' the lowest of the position variants' mean best
    smoothed validation top-1; also returned as ``level_rule``) and the headline's analysis ('final' where the
    position variants' mean final smoothed validation top-1 lie within ``MATCH_WITHIN`` points, else 'matched'),
    from validation top-1 alone, smoothed over ``smooth`` checks."""
    position = [v for v in variants if not VARIANTS[v].cnn]
    curves = {(r['variant'], r['seed']): checks_of(r)[0] for r in results}
    vals = {key: smoothed([c['val'] for c in checks], smooth) for key, checks in curves.items()}
    best = {p: [max(v) for (variant, _), v in vals.items() if variant == p] for p in position}
    rule = MATCHES[match].level(best) if position else 0.
    level = rule if level is None else level
    per_run = {key: run_checks(checks, smooth, level, match) for key, checks in curves.items()}
    final_val = [float(np.mean([v[-1] for (variant, _), v in vals.items() if variant == p])) for p in position]
    spread = max(final_val) - min(final_val) if final_val else 0.
    return dict(checks={name: {key: c[name] for key, c in per_run.items()} for name in ('final', 'matched')},
                level=round(level, 2), level_rule=round(rule, 2), final_val_spread=round(spread, 2),
                headline='final' if spread <= MATCH_WITHIN else 'matched')


def summarise_analysis(results: list[dict], variants: Sequence[str], chosen: dict, width: int = 1,
                       smooth: int = 1) -> dict:
    """Per variant and test: validation top-1 as the selection read it (the mean of ``smooth`` checks) and test
    top-1 (mean ± sd) at the chosen checks (``{(variant, seed): check}``; each run's tests averaged over the
    ``width`` checks centred there, ``window_tests``), the paired change from 56 px and that change as a share of the
    remaining error at 56 px (%); per pair of variants and test the paired difference in top-1 at 56 px and in
    the change; per larger test the leader (the largest mean change) and whether its interval against every other
    variant excludes zero."""
    by_variant = {v: sorted((r for r in results if r['variant'] == v), key=lambda r: r['seed']) for v in variants}
    at = {v: [next(c for c in checks_of(r)[0] if c['check'] == chosen[(v, r['seed'])]) for r in runs]
          for v, runs in by_variant.items()}
    top1 = {v: [window_tests(r, chosen[(v, r['seed'])], width) for r in runs] for v, runs in by_variant.items()}
    val = {v: [window_val(r, chosen[(v, r['seed'])], smooth) for r in runs] for v, runs in by_variant.items()}
    rows = []
    for v, tops in top1.items():
        runs = by_variant[v]
        base = [t[BASE] for t in tops]
        for key in test_keys():
            acc = [t[key] for t in tops]
            m, s = mean_std(acc)
            row = dict(variant=v, test=key, top1_mean=m, top1_std=s, top1_per_seed=acc, seeds=[r['seed'] for r in runs],
                       epochs=[c['epoch'] for c in at[v]], val_mean=mean_std(val[v])[0])
            if key != BASE:
                row['change'] = paired(acc, base)
                share = [100 * (a - b) / max(100 - b, 1e-9) for a, b in zip(acc, base, strict=True)]
                row['error_share'] = paired(share, [0.] * len(acc))
            rows.append(row)

    def change(v, key):
        return [t[key] - t[BASE] for t in top1[v]]
    pairs = []
    for a, b in itertools.combinations(variants, 2):
        for key in test_keys():
            entry = dict(a=a, b=b, test=key, top1=paired([t[key] for t in top1[a]], [t[key] for t in top1[b]]))
            if key != BASE:
                entry['change'] = paired(change(a, key), change(b, key))
            pairs.append(entry)
    leaders = {}
    for key in claimed_keys():
        lead = max(variants, key=lambda v: float(np.mean(change(v, key))))
        against = {v: paired(change(lead, key), change(v, key)) for v in variants if v != lead}
        leaders[key] = dict(variant=lead, separated=bool(against) and all(d['sign'] == '+' for d in against.values()),
                            tied_with=[v for v, d in against.items() if d['sign'] != '+'])
    position = [v for v in variants if not VARIANTS[v].cnn]
    starts = [next(r['top1_mean'] for r in rows if r['variant'] == v and r['test'] == BASE) for v in position]
    return dict(rows=rows, pairs=pairs, leaders=leaders,
                start_spread=round(max(starts) - min(starts), 2) if starts else 0.)


def summarise(results: list[dict], config: StudyConfig, smooth: int, level: float | None = None,
              width: int = 1, match: str = 'first') -> dict:
    """Both analyses (``summarise_analysis``) at the checks ``select`` picks with ``smooth``, ``level`` (None: the
    rule's, for a study whose every check was tested or whose level the rule gave) and ``match``, each run's tests
    averaged over the ``width`` checks centred there; refuses runs without tests at those checks."""
    chosen = select(results, config.variants, smooth, level, match)
    run_of = {(r['variant'], r['seed']): r for r in results}
    untested = sorted(f'{v}-seed{s} (check {i})' for per_run in chosen['checks'].values()
                      for (v, s), c in per_run.items() for i in window(checks_of(run_of[(v, s)])[0], c, width)
                      if str(i) not in checks_of(run_of[(v, s)])[1])
    if untested:
        raise SystemExit(f'[native] no tests at the checks that --smooth {smooth} --level {level} --window {width} '
                         f'--match {match} select: {", ".join(untested)}; each run is tested at the checks its own '
                         'record\'s smooth, level, window and match select')
    analyses = {name: summarise_analysis(results, config.variants, checks, width, smooth)
                for name, checks in chosen['checks'].items()}
    checks = {name: {f'{v}-seed{s}': c for (v, s), c in per_run.items()} for name, per_run in chosen['checks'].items()}
    return dict(analyses=analyses, checks=checks, level=chosen['level'], level_rule=chosen['level_rule'],
                level_fixed=level is not None, final_val_spread=chosen['final_val_spread'],
                headline=chosen['headline'], smooth=smooth, window=width, match=match)
