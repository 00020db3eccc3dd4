"""What every verdict table is made of: paired changes and differences over seeds, the table cell that bolds a
difference whose interval excludes zero, the leader rule, and the one Markdown table renderer."""
from collections.abc import Sequence

from benchmarks.study.common import format_paired, paired
from benchmarks.study.config import VARIANTS
from benchmarks.study.summary import Summary


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


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The one Markdown table renderer: a header, its rule, a line per row."""
    return (['|' + '|'.join(f' {c} ' if c else ' ' for c in header) + '|', '|' + '---|' * len(header)]
            + ['| ' + ' | '.join(row) + ' |' for row in rows])


def change_heads(s: Summary) -> list[str]:
    return [f'change at {size_heading(x, s.base)}' for x in s.sizes]
