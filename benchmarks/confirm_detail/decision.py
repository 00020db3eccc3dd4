"""What a study could decide and what it decides: for a finished study, the power its contrast of the PEG and the
table had for the paper's difference, the bound its interval sets and the paper's own measure beside it
(``hindsight``: read after the runs from their spread, no claim); a protocol's primary contrast decided by the
rules it states (``decide``); and a next study planned from a finished one's runs (``plan``): the spread of the
contrast projected to more test scenes, the power of each rule, the control's target and the CPU time.

The paper's difference (CPVT Table 2, trained at 224 px and tested at 384 without fine-tuning): CPVT-Ti 72.4 ->
73.2, DeiT-tiny 72.2 -> 71.2, so the PEG's change exceeds the table's by +0.8 - (-1.0) = +1.8 points
(``PAPER_DIFFERENCE``); the studies' 68 px test of a 40 px model is the nearest to its 384 / 224."""
import math
import statistics
from collections.abc import Sequence

from benchmarks.confirm_detail.protocol import Protocol
from benchmarks.study.config import VARIANTS
from benchmarks.study.specs import Drawn, DrawnResized
from benchmarks.study.stats import interval, paired_test, power_above, power_within

PAPER = dict(peg=(72.4, 73.2), table=(72.2, 71.2), sizes=(224, 384))   # top-1 at 224 and at 384 px
PAPER_DIFFERENCE = round((PAPER['peg'][1] - PAPER['peg'][0]) - (PAPER['table'][1] - PAPER['table'][0]), 2)
PEG, TABLE = 'peg_0-5', 'learned'
POWER_METHOD = ('the paired t interval\'s power from the noncentral t distribution (stats.power_above, '
                'stats.power_within: exact up to quadrature over the sample SD), the true SD taken as the SD of the '
                'contrast\'s per-seed values')


def paper_size(protocol: Protocol) -> int:
    """The upsampled test size nearest the paper's 384 / 224 of the training size."""
    ratio = PAPER['sizes'][1] / PAPER['sizes'][0]
    return min(protocol.upsampled, key=lambda s: abs(s - protocol.train_size * ratio))


def _value(check: dict, measure: str, size: int, train_size: int, on: str = 'final') -> float:
    t = check[on]
    native = t[Drawn(size).key]
    return native - (t[DrawnResized(size).key] if measure == 'detail' else t[Drawn(train_size).key])


def _paired(values: Sequence[float], level: float = 0.95) -> dict:
    test = paired_test(list(values), [0.] * len(values))
    lo, hi = interval(test, level)
    return dict(mean=round(test['mean'], 2), lo=None if lo is None else round(lo, 2),
                hi=None if hi is None else round(hi, 2), n=test['n'], sd=round(test['sd'], 3))


def contrast_values(final: dict[str, list[dict]], measure: str, a: str, b: str, size: int, train_size: int,
                    on: str = 'final') -> list[float]:
    """Per seed (``final``: each arm's final checks, paired by seed) ``a``'s measure less ``b``'s: 'detail'
    (native - upsampled at ``size``) or 'change' (native at ``size`` - native at the training size), on every
    test scene (``on`` 'final') or on the first ``tests.check_images`` ('tests')."""
    return [_value(x, measure, size, train_size, on) - _value(y, measure, size, train_size, on)
            for x, y in zip(final[a], final[b], strict=True)]


def hindsight(final: dict[str, list[dict]], protocol: Protocol, family: int) -> dict | None:
    """After the runs, from their spread (no claim; None without both the PEG and the table, or with fewer than
    two seeds): for the PEG's gain from detail less the table's at the size nearest the paper's ratio, the power
    its 95% interval had to exclude zero on the positive side were the true difference the paper's
    (``PAPER_DIFFERENCE``), unadjusted and at Holm's first step over the ``family`` contrasts (alpha / family,
    the level a contrast is tested at unless another is rejected before it), its true SD taken as the observed
    SD of its per-seed values; the upper end of its unadjusted 95% interval ('bound'); and the paper's own
    measure, the PEG's change from the training size less the table's, with its 95% interval ('paper')."""
    if PEG not in final or TABLE not in final or len(final[PEG]) < 2:
        return None
    size, train = paper_size(protocol), protocol.train_size
    confidence = protocol['analysis']['confidence']
    detail = _paired(contrast_values(final, 'detail', PEG, TABLE, size, train), confidence)
    sd, n = statistics.stdev(contrast_values(final, 'detail', PEG, TABLE, size, train)), detail['n']
    holm_level = 1 - (1 - confidence) / family
    return dict(size=size, effect=PAPER_DIFFERENCE, n=n, sd=round(sd, 2), family=family,
                holm_level=round(holm_level, 6), method=POWER_METHOD,
                power=round(power_above(PAPER_DIFFERENCE, sd, n, confidence), 4) if sd > 0 else None,
                power_holm=round(power_above(PAPER_DIFFERENCE, sd, n, holm_level), 4) if sd > 0 else None,
                detail=detail, bound=detail['hi'],
                paper=_paired(contrast_values(final, 'change', PEG, TABLE, size, train), confidence))


VERDICTS = ('superiority', 'superiority, within the margin', 'equivalence', 'inferiority', 'undecided')


def decide(values: Sequence[float], rule: dict) -> dict:
    """The primary contrast (``values``: its per-seed values) decided by the protocol's ``decision`` rule:
    'superiority' where its ``superiority.confidence`` interval lies above ``superiority.above``, 'equivalence'
    where its ``equivalence.confidence`` interval lies within -``margin``..+``margin``, both ('superiority, within
    the margin') where both hold, 'inferiority' where the superiority interval lies below -``above``, else
    'undecided'; with both intervals."""
    sup, eq = rule['superiority'], rule['equivalence']
    wide, narrow = _paired(values, sup['confidence']), _paired(values, eq['confidence'])
    if wide['lo'] is None:
        return dict(wide=wide, narrow=narrow, verdict='undecided')
    above, below = wide['lo'] > sup['above'], wide['hi'] < -sup['above']
    within = -eq['margin'] < narrow['lo'] and narrow['hi'] < eq['margin']
    verdict = ('superiority, within the margin' if above and within else 'superiority' if above else
               'equivalence' if within else 'inferiority' if below else 'undecided')
    return dict(wide=wide, narrow=narrow, verdict=verdict)


def plan(runs: list[dict], source: Protocol, seeds: int, test_images: int, effect: float = PAPER_DIFFERENCE,
         margin: float = 2., arms: Sequence[str] = (PEG, TABLE), control: str = 'cnn') -> dict:
    """A study of the PEG less the table's gain from detail at the paper's size, ``seeds`` seeds and
    ``test_images`` test scenes, planned from the finished study ``runs`` (under ``source``):

    * 'sd': the contrast's SD across seeds there ('observed', on its ``data.test_images`` scenes) and projected
      to ``test_images`` ('projected'): the share of a contrast's variance that comes from which test scenes were
      drawn ('test_share'), estimated from each final check read on its first ``tests.check_images`` scenes k and
      on all N (across seeds, Var(c_k - c_N) = sigma^2 (1 / k - 1 / N) of a per-scene variance sigma^2, the
      seeds' own spread cancelling), pooled over every pair of the source's transformer arms (sum of the scene
      parts over sum of the variances), shrinks by N / ``test_images``;
    * 'power': the power of each rule under either SD (``stats.power_above``: the 95% interval above zero where
      the true difference is ``effect``; ``stats.power_within``: the 90% interval within +-``margin`` where it is
      zero);
    * 'target': the transformers' (``arms``) mean top-1 drawn at the training size, final epoch, the control's
      width is fixed to reach;
    * 'minutes': per arm, its median training time there and its final check's time scaled to ``test_images``
      (the final epoch tested alone; ``control``'s at its full width, an upper bound), and the total over
      ``seeds`` seeds in CPU-hours."""
    arm_names = sorted({r['variant'] for r in runs}, key=lambda a: (a != PEG, a))
    final = {a: [r['checks'][-1] for r in sorted((r for r in runs if r['variant'] == a), key=lambda r: r['seed'])]
             for a in arm_names}
    size, train = paper_size(source), source.train_size
    k, n_old = source['tests']['check_images'], source['data']['test_images']
    values = contrast_values(final, 'detail', PEG, TABLE, size, train)
    observed = statistics.variance(values)
    transformers = [a for a in arm_names if not VARIANTS[a].cnn]
    scenes = total = 0.
    for i, a in enumerate(transformers):
        for b in transformers[i + 1:]:
            split = [x - y for x, y in zip(contrast_values(final, 'detail', a, b, size, train, 'tests'),
                                           contrast_values(final, 'detail', a, b, size, train), strict=True)]
            scenes += statistics.variance(split) / (n_old / k - 1)
            total += statistics.variance(contrast_values(final, 'detail', a, b, size, train))
    share = scenes / total
    sds = dict(observed=math.sqrt(observed), projected=math.sqrt(observed * (1 - share * (1 - n_old / test_images))))
    power = {which: dict(superiority=round(power_above(effect, sd, seeds, 0.95), 3),
                         equivalence=round(power_within(margin, sd, seeds, 0.90), 3)) for which, sd in sds.items()}
    target = statistics.mean(c['final'][Drawn(train).key] for a in arms for c in final[a])
    minutes = {}
    for a in (*arms, control):
        mine = [r for r in runs if r['variant'] == a]
        minutes[a] = round(statistics.median(r['train_seconds'] for r in mine) / 60
                           + statistics.median(r['checks'][-1]['seconds'] for r in mine) / 60 * test_images / n_old, 1)
    return dict(size=size, effect=effect, margin=margin, seeds=seeds, test_images=test_images,
                test_share=round(share, 3), sd={w: round(v, 2) for w, v in sds.items()}, power=power,
                target=round(target, 1), minutes=minutes,
                cpu_hours=round(seeds * sum(minutes.values()) / 60, 1))
