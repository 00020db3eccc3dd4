"""Paired intervals at any confidence and Holm's step-down correction over a family of contrasts, from Student's t
distribution computed exactly for whole degrees of freedom (the standard library has no t distribution), and the
power of a paired t interval to lie above zero or within a margin (``power_above``, ``power_within``)."""
import math
import statistics
from collections.abc import Callable, Mapping, Sequence


def t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (>= 1, whole) degrees of freedom: the finite series of Abramowitz
    and Stegun 26.7.3 (odd ``df``) and 26.7.4 (even), exact to float rounding."""
    if not isinstance(df, int) or df < 1:
        raise ValueError(f'degrees of freedom must be a whole number >= 1, got {df!r}')
    t = abs(t)
    if math.isinf(t):
        return 1.
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1., 1.
        for k in range(1, df // 2):          # (1 * 3 * ... (2k - 1)) / (2 * 4 * ... 2k) cos^2k
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        return min(1., s * total)
    if df == 1:
        return 2 * theta / math.pi
    term, total = 1., 1.
    for k in range(1, (df - 1) // 2):        # (2 * 4 * ... 2k) / (3 * 5 * ... (2k + 1)) cos^2k
        term *= (2 * k) / (2 * k + 1) * c2
        total += term
    return min(1., 2 / math.pi * (theta + s * math.sqrt(c2) * total))


def t_quantile(level: float, df: int) -> float:
    """The two-sided critical value: the t with P(|T| <= t) = ``level`` (0 < level < 1), by bisection."""
    if not 0 < level < 1:
        raise ValueError(f'level must lie in (0, 1), got {level!r}')
    lo, hi = 0., 1.
    while t_within(hi, df) < level:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_within(mid, df) < level else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def paired_test(a: Sequence[float], b: Sequence[float]) -> dict:
    """The paired difference ``a - b`` (entries paired by position): its mean, sample standard deviation,
    standard error, ``n`` and the two-sided p-value of the t test of a zero mean (None for fewer than two pairs;
    1 where every difference is zero, 0 where they are equal and not zero)."""
    if len(a) != len(b) or not a:
        raise ValueError(f'a paired test needs two equally long, non-empty sequences, got {len(a)} and {len(b)}')
    diff = [x - y for x, y in zip(a, b, strict=True)]
    mean = statistics.mean(diff)
    if len(diff) < 2:
        return dict(mean=mean, sd=0., se=None, n=1, p=None)
    sd = statistics.stdev(diff)
    se = sd / math.sqrt(len(diff))
    p = (1. if mean == 0 else 0.) if se == 0 else 1 - t_within(mean / se, len(diff) - 1)
    return dict(mean=mean, sd=sd, se=se, n=len(diff), p=max(0., p))


def interval(test: dict, level: float) -> tuple[float, float] | tuple[None, None]:
    """The two-sided ``level`` t interval of a ``paired_test``'s mean (None, None for one pair)."""
    if test['se'] is None:
        return None, None
    half = t_quantile(level, test['n'] - 1) * test['se']
    return test['mean'] - half, test['mean'] + half


def holm(tests: Mapping[str, dict], alpha: float = 0.05) -> dict[str, dict]:
    """Holm's step-down correction over the family ``tests`` ({name: ``paired_test``}), each with its adjusted
    interval: sorted by p, the j-th of m is tested at alpha / (m - j + 1) while every earlier one is rejected;
    from the first not rejected on, every later one is tested at that first one's level. Each contrast's interval
    is its t interval at 1 - the level it is tested at, so that it excludes zero exactly where Holm rejects.
    Returns per name: ``mean``, ``lo``, ``hi``, ``p``, ``p_holm`` (the adjusted p-value, max over the step-down's
    (m - i + 1) p_(i) up to it, at most 1), ``level`` (the interval's confidence), ``rejected`` and ``sign`` ('+'
    or '-' where rejected, else '='). A contrast without a p-value (one pair) is never rejected and has no
    interval."""
    if not 0 < alpha < 1:
        raise ValueError(f'alpha must lie in (0, 1), got {alpha!r}')
    m = len(tests)
    order = sorted(tests, key=lambda name: (tests[name]['p'] is None, tests[name]['p'] or 0., name))
    out, running, stopped_at = {}, 0., None
    for j, name in enumerate(order):
        test = tests[name]
        step = alpha / (m - j) if stopped_at is None else stopped_at
        rejected = stopped_at is None and test['p'] is not None and test['p'] <= step
        if not rejected and stopped_at is None:
            stopped_at = step
        running = max(running, min(1., (m - j) * test['p'])) if test['p'] is not None else 1.
        lo, hi = interval(test, 1 - step)
        out[name] = dict(mean=test['mean'], lo=lo, hi=hi, p=test['p'], p_holm=running, level=1 - step,
                         rejected=rejected, sign=('+' if test['mean'] > 0 else '-') if rejected else '=')
    return {name: out[name] for name in tests}


def _over_sample_sd(df: int, f: Callable[[float], float], steps: int = 2000) -> float:
    """E[f(r)] for r = s / sigma, the ratio of a sample standard deviation with ``df`` degrees of freedom to the true
    one (r = sqrt(V / df), V chi-square with ``df``): Simpson's rule over w = sqrt(V) on [0, sqrt(df) + 12], where
    w's density w^(df - 1) exp(-w^2 / 2) / (2^(df / 2 - 1) Gamma(df / 2)) is finite for every df."""
    top = math.sqrt(df) + 12.
    h, log_norm = top / steps, (df / 2 - 1) * math.log(2) + math.lgamma(df / 2)
    total = 0.
    for i in range(steps + 1):
        w = i * h
        density = math.exp((df - 1) * math.log(w) - w * w / 2 - log_norm) if w > 0 else \
            (math.exp(-log_norm) if df == 1 else 0.)
        total += (1 if i in (0, steps) else 4 if i % 2 else 2) * density * f(w / math.sqrt(df))
    return total * h / 3


def _check_power(sd: float, n: int, level: float) -> None:
    if not (isinstance(n, int) and n >= 2 and sd > 0 and 0 < level < 1):
        raise ValueError(f'power needs n >= 2 pairs (whole), sd > 0 and a level in (0, 1), got n={n!r}, sd={sd!r}, '
                         f'level={level!r}')


def power_above(effect: float, sd: float, n: int, level: float) -> float:
    """The probability that the two-sided ``level`` t interval of the mean of ``n`` paired differences lies above
    zero, where their true mean is ``effect`` and their true standard deviation ``sd``: the noncentral t
    distribution's upper tail, P(T' > t), T' with n - 1 degrees of freedom and noncentrality effect sqrt(n) / sd,
    computed as E[Phi(effect sqrt(n) / sd - t r)] over the sample SD's ratio r to the true one
    (``_over_sample_sd``)."""
    _check_power(sd, n, level)
    t, shift = t_quantile(level, n - 1), effect * math.sqrt(n) / sd
    normal = statistics.NormalDist()
    return _over_sample_sd(n - 1, lambda r: normal.cdf(shift - t * r))


def power_within(margin: float, sd: float, n: int, level: float, true: float = 0.) -> float:
    """The probability that the two-sided ``level`` t interval of the mean of ``n`` paired differences lies within
    -``margin``..+``margin`` (equivalence; at level 0.90 the two one-sided tests at 5%), where their true mean is
    ``true`` and their true standard deviation ``sd``: E[P(-margin + t s / sqrt(n) < mean < margin - t s / sqrt(n))]
    over the sample SD s (``_over_sample_sd``), the mean normal and independent of s."""
    _check_power(sd, n, level)
    t, se = t_quantile(level, n - 1), sd / math.sqrt(n)
    normal = statistics.NormalDist()
    return _over_sample_sd(n - 1, lambda r: max(0., normal.cdf((margin - true - t * r * se) / se)
                                                - normal.cdf((-margin - true + t * r * se) / se)))


__all__ = ['holm', 'interval', 'paired_test', 'power_above', 'power_within', 't_quantile', 't_within']
