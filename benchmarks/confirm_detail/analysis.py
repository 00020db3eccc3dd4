"""The final-epoch analysis the protocol names, from the runs' records alone: per arm and size the gains from detail
and from scale (``summarise``), the contrasts with Holm's correction over the protocol's family
(``analyse_contrasts``), each claim's verdict (``verdict``), the primary contrast's decision and what a study
could decide (``decision``), the learning, ceiling and control rules (``learns``, ``ceiling``, ``control``), every
check's curve (``curves``) and the recipe a pilot fixes (``pilot_choice``)."""
from collections.abc import Sequence

import numpy as np

from benchmarks.confirm_detail import decision
from benchmarks.confirm_detail.protocol import Protocol
from benchmarks.study.common import mean_std
from benchmarks.study.specs import Drawn, DrawnResized
from benchmarks.study.stats import holm, interval, paired_test


def measure(check: dict, name: str, size: int | None, train_size: int, on: str = 'final') -> float:
    """One check's value of a measure, from its tests ``on`` ('final': every test scene, the final check's;
    'tests': the first ``tests.check_images``, every check's): 'start' (native top-1 at the training size), 'val'
    (validation top-1), 'detail' (native - upsampled at ``size``), 'scale' (upsampled at ``size`` - start),
    'change' (native at ``size`` - start)."""
    t = check[on]
    start = t[Drawn(train_size).key]
    if name == 'start':
        return start
    if name == 'val':
        return check['val']
    native, upsampled = t[Drawn(size).key], t[DrawnResized(size).key]
    return {'detail': native - upsampled, 'scale': upsampled - start, 'change': native - start}[name]


def final_check(result: dict) -> dict:
    """A run's final check (its last epoch's); a ValueError where the run's checks stop before its last epoch."""
    last = result['checks'][-1]
    if last['epoch'] != result['epochs']:
        raise ValueError(f'{result["variant"]} seed {result["seed"]}: the last check is at epoch {last["epoch"]}, '
                         f'not the final epoch {result["epochs"]}')
    return last


def by_arm(results: list[dict], arms: Sequence[str]) -> dict[str, list[dict]]:
    """Each arm's runs in seed order; a ValueError where the arms do not share their seeds (the pairing)."""
    runs = {a: sorted((r for r in results if r['variant'] == a), key=lambda r: r['seed']) for a in arms}
    seeds = {a: [r['seed'] for r in rs] for a, rs in runs.items()}
    if len({tuple(s) for s in seeds.values()}) != 1 or not next(iter(seeds.values())):
        raise ValueError(f'every arm needs runs of the same seeds (paired by seed), got {seeds}')
    return runs


def _paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
    test = paired_test(a, b)
    lo, hi = interval(test, level)
    return dict(mean=round(test['mean'], 2), lo=_round(lo), hi=_round(hi), n=test['n'], p=test['p'],
                sign='=' if lo is None or lo <= 0 <= hi else '+' if lo > 0 else '-')


def summarise(results: list[dict], protocol: Protocol, arms: Sequence[str]) -> dict:
    """The final-epoch analysis of ``results`` (``arms``' runs, paired by seed): per arm its start, validation
    and training top-1 ('arms'); per arm and upsampled size native and upsampled top-1 (mean, sd, per seed) with
    the gains from detail and from scale and the change, each paired with its 95% interval ('rows'); the
    protocol's contrasts, Holm-corrected over its family ('contrasts'); each claim's verdict ('claims'); the
    primary contrast decided by the protocol's ``decision`` rule ('decision', ``decision.decide``; None without
    one) or, without one, what the runs' spread says they could decide ('hindsight', ``decision.hindsight``); the
    learning rule ('learns'); the ceiling rule ('ceiling'); the control rule ('control'); and each arm's curve,
    one point per check: mean start, gain from detail and change per size ('curves')."""
    size = protocol.train_size
    runs = by_arm(results, arms)
    final = {a: [final_check(r) for r in rs] for a, rs in runs.items()}
    arm_rows = {}
    for a, checks in final.items():
        start, val = [measure(c, 'start', None, size) for c in checks], [c['val'] for c in checks]
        trained = [r['log'][-1]['train_top1'] for r in runs[a]]
        arm_rows[a] = dict(arm=a, seeds=[r['seed'] for r in runs[a]], start=mean_std(start), start_per_seed=start,
                           val=mean_std(val), val_per_seed=val, train_top1=mean_std(trained))
    rows = []
    for a, checks in final.items():
        for s in protocol.upsampled:
            native = [c['final'][Drawn(s).key] for c in checks]
            upsampled = [c['final'][DrawnResized(s).key] for c in checks]
            start = arm_rows[a]['start_per_seed']
            rows.append(dict(arm=a, size=s, native=mean_std(native), upsampled=mean_std(upsampled),
                             native_per_seed=native, upsampled_per_seed=upsampled,
                             detail=_paired(native, upsampled), scale=_paired(upsampled, start),
                             change=_paired(native, start)))
    contrasts = analyse_contrasts(final, protocol)
    claims = [dict(claim, verdict=verdict(contrasts[claim['contrast']], claim['direction']))
              for claim in protocol['claims'] if claim['contrast'] in contrasts]
    rule = protocol.data.get('decision')
    decided = dict(decision.decide(contrasts[rule['contrast']]['per_seed'], rule), rule=rule) \
        if rule and rule['contrast'] in contrasts else None
    family = sum(1 for c in contrasts.values() if not c['secondary'])
    return dict(arms=arm_rows, rows=rows, contrasts=contrasts, claims=claims, decision=decided,
                hindsight=None if rule else decision.hindsight(final, protocol, family),
                learns=learns(arm_rows, protocol), ceiling=ceiling(rows, protocol), control=control(arm_rows, protocol),
                curves=curves(runs, protocol))


def analyse_contrasts(final: dict[str, list[dict]], protocol: Protocol) -> dict[str, dict]:
    """Each of the protocol's contrasts among the arms in ``final`` (each arm's final checks, paired by seed):
    the per-seed values (a's measure, less b's where it names b), the paired mean with its 95% interval, and
    Holm's adjusted interval and p-value over the family of those contrasts (``stats.holm``): those
    ``analysis.family`` names, every contrast where it names none. A contrast outside the family ('secondary')
    keeps its unadjusted interval and p-value in those places."""
    size, alpha = protocol.train_size, 1 - protocol['analysis']['confidence']
    named = [c for c in protocol['analysis']['contrasts'] if c['a'] in final and c.get('b', c['a']) in final]
    family = protocol['analysis'].get('family')
    values, paired = {}, {}
    for c in named:
        a = [measure(check, c['measure'], c.get('size'), size) for check in final[c['a']]]
        b = [measure(check, c['measure'], c.get('size'), size) for check in final[c['b']]] if c.get('b') \
            else [0.] * len(a)
        values[c['id']] = [x - y for x, y in zip(a, b, strict=True)]
        paired[c['id']] = paired_test(a, b)
    adjusted = holm({k: t for k, t in paired.items() if family is None or k in family}, alpha)
    out = {}
    for c in named:
        test = paired[c['id']]
        lo, hi = interval(test, 1 - alpha)
        adj = adjusted.get(c['id']) or dict(
            lo=lo, hi=hi, level=1 - alpha, p_holm=1. if test['p'] is None else test['p'],
            sign='=' if lo is None or lo <= 0 <= hi else '+' if lo > 0 else '-')
        out[c['id']] = dict(c, per_seed=[round(v, 2) for v in values[c['id']]], mean=round(test['mean'], 2),
                            lo=_round(lo), hi=_round(hi), p=test['p'], holm_lo=_round(adj['lo']),
                            holm_hi=_round(adj['hi']), holm_level=adj['level'], p_holm=adj['p_holm'],
                            sign=adj['sign'], secondary=c['id'] not in adjusted)
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def verdict(contrast: dict, direction: str) -> str:
    """'holds' where the contrast's Holm-adjusted interval excludes zero on the claimed side ('either': on
    either), 'reversed' where it excludes zero on the other, else 'not shown'."""
    sign = contrast['sign']
    if sign == '=':
        return 'not shown'
    return 'holds' if direction in ('either', sign) else 'reversed'


def learns(arm_rows: dict, protocol: Protocol) -> dict:
    """The learning rule on validation top-1 at the final epoch (mean over seeds): the reference
    (``learns.reference``) reaches ``learns.reference_min`` (``Protocol.learns``) ('reference_val',
    'reference_learns') and each of ``learns.arms`` lies within ``learns.within`` points of it ('gaps':
    reference - arm); 'holds' where both do (None without the reference or those arms). None where the protocol
    has no learning rule."""
    rule = protocol.learns
    if rule is None:
        return None
    if rule['reference'] not in arm_rows:
        return dict(rule, gaps={}, holds=None)
    ref = arm_rows[rule['reference']]['val'][0]
    gaps = {a: round(ref - arm_rows[a]['val'][0], 2) for a in rule['arms'] if a in arm_rows}
    learned = ref >= rule['reference_min']
    return dict(rule, reference_val=round(ref, 2), reference_learns=learned, gaps=gaps,
                holds=learned and all(g <= rule['within'] for g in gaps.values()) if gaps else None)


def ceiling(rows: list[dict], protocol: Protocol) -> dict | None:
    """The ceiling rule (``Protocol.ceiling``; None without one) on the final epoch's every test scene: per arm of
    ``ceiling.arms`` the higher of its native and upsampled top-1 at ``ceiling.size`` (mean over seeds; 'tops'),
    and whether every one stays below ``ceiling.below`` ('clear'; None without those arms), so that the gains
    from detail there are not squeezed against 100%."""
    rule = protocol.ceiling
    if rule is None:
        return None
    tops = {r['arm']: round(max(r['native'][0], r['upsampled'][0]), 2) for r in rows
            if r['arm'] in rule['arms'] and r['size'] == rule['size']}
    return dict(rule, tops=tops, clear=all(t < rule['below'] for t in tops.values()) if tops else None)


def control(arm_rows: dict, protocol: Protocol) -> dict | None:
    """The control rule (``Protocol.control``; None without one, or without its arm): the control arm's start
    (top-1 drawn at the training size, final epoch, mean over seeds; 'start'), its distance from the rule's
    ``target`` ('distance': start - target) and whether it lies within ``within`` points of it ('holds')."""
    rule = protocol.control
    if rule is None or rule['arm'] not in arm_rows:
        return None
    start = arm_rows[rule['arm']]['start'][0]
    distance = round(start - rule['target'], 2)
    return dict(rule, start=start, distance=distance, holds=abs(distance) <= rule['within'])


def curves(runs: dict[str, list[dict]], protocol: Protocol) -> dict[str, list[dict]]:
    """Per arm, one point per check (the checks every seed has): its epoch and the mean over seeds of the start,
    the validation, and per upsampled size the gain from detail and the change, each check read on the same
    ``tests.check_images`` test scenes."""
    size, out = protocol.train_size, {}
    for a, rs in runs.items():
        count = min(len(r['checks']) for r in rs)
        points = []
        for i in range(count):
            checks = [r['checks'][i] for r in rs]

            def mean(name: str, at: int | None = None, checks=checks) -> float:
                return round(float(np.mean([measure(c, name, at, size, 'tests') for c in checks])), 2)
            points.append(dict(epoch=checks[0]['epoch'], start=mean('start'), val=mean('val'),
                               detail={str(s): mean('detail', s) for s in protocol.upsampled},
                               change={str(s): mean('change', s) for s in protocol.upsampled}))
        out[a] = points
    return out


def pilot_choice(summaries: dict[str, dict]) -> dict:
    """The recipe the pilot fixes, from each candidate's learning and ceiling rules (``summaries``: {candidate:
    summary}, in the protocol's order; a summary without a ceiling rule is clear of it): the first whose learning
    rule holds and which is clear of the ceiling; else ('holds' False) the one whose largest gap is smallest among
    those whose reference learns and which are clear, else among those whose reference learns, else among all.
    'clear': each candidate's ceiling verdict. Where the summaries carry a control rule (``control``), it decides
    instead (``control_choice``)."""
    if any(s.get('control') for s in summaries.values()):
        return control_choice(summaries)
    gaps = {c: max(s['learns']['gaps'].values()) for c, s in summaries.items() if s.get('learns') and
            s['learns']['gaps']}
    if not gaps:
        return dict(candidate=None, holds=None, gaps={}, clear={})
    clear = {c: (s.get('ceiling') or {}).get('clear') is not False for c, s in summaries.items()}
    held = [c for c in summaries if summaries[c]['learns']['holds'] and clear[c]]
    learning = [c for c in gaps if summaries[c]['learns']['reference_learns']]
    chosen = held[0] if held else min([c for c in learning if clear[c]] or learning or list(gaps), key=gaps.get)
    return dict(candidate=chosen, holds=bool(held), gaps=gaps, clear=clear)


def control_choice(summaries: dict[str, dict]) -> dict:
    """The control's recipe a pilot fixes (``summaries``: {candidate: summary with a ``control`` rule}, in the
    protocol's order): the candidate whose control starts nearest the rule's target among those clear of the
    ceiling (else among all; the first of equals); 'holds' where it is clear and within the rule's ``within``
    points of the target. 'distances': each candidate's start less the target; 'clear': each one's ceiling
    verdict."""
    distances = {c: s['control']['distance'] for c, s in summaries.items() if s.get('control')}
    clear = {c: (summaries[c].get('ceiling') or {}).get('clear') is not False for c in distances}
    pool = [c for c in distances if clear[c]] or list(distances)
    chosen = min(pool, key=lambda c: abs(distances[c]))
    return dict(candidate=chosen, holds=clear[chosen] and summaries[chosen]['control']['holds'],
                distances=distances, clear=clear)
