"""What the studies share: mean and spread over seeds, paired differences with their 95% interval, the CSV
table, an invocation's metadata, where runs are kept, sharding and the options every trained study takes."""
import argparse
import csv
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.study.records import code_version


def mean_std(values: Sequence[float], digits: int = 2) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed)."""
    return round(statistics.mean(values), digits), round(statistics.stdev(values), digits) if len(values) > 1 else 0.


# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def paired(a: Sequence[float], b: Sequence[float]) -> dict:
    """The paired difference ``a - b`` (entries paired by position: the same seed): its mean, sample standard
    deviation, the 95% t interval of the mean (n - 1 degrees of freedom) and the sign it shows: '+' or '-' where
    the interval excludes zero, '=' where it does not ("tied"); one pair has no interval (None) and shows '='.
    Takes 1..31 pairs."""
    if len(a) != len(b) or not 1 <= len(a) <= len(_T975) + 1:
        raise ValueError(f'paired needs two equally long sequences of 1..{len(_T975) + 1} values, got {len(a)} and '
                         f'{len(b)}')
    diff = [x - y for x, y in zip(a, b, strict=True)]
    if len(diff) == 1:
        return dict(mean=round(diff[0], 2), sd=0., lo=None, hi=None, n=1, sign='=')
    mean, sd = statistics.mean(diff), statistics.stdev(diff)
    half = _T975[len(diff) - 2] * sd / len(diff) ** 0.5
    lo, hi = mean - half, mean + half
    return dict(mean=round(mean, 2), sd=round(sd, 2), lo=round(lo, 2), hi=round(hi, 2), n=len(diff),
                sign='+' if lo > 0 else '-' if hi < 0 else '=')


def format_paired(d: dict) -> str:
    """'+1.23 [+0.40, +2.06]': the mean paired difference and its 95% interval (the mean alone for one pair)."""
    if d['lo'] is None:
        return f'{d["mean"]:+.2f}'
    return f'{d["mean"]:+.2f} [{d["lo"]:+.2f}, {d["hi"]:+.2f}]'


def write_csv(rows: list[dict], path: Path) -> None:
    """The summary rows as CSV (without the per-row seed list, which the JSON keeps)."""
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != 'seeds'])
        writer.writeheader()
        writer.writerows({k: v for k, v in row.items() if k != 'seeds'} for row in rows)


def run_meta(module: str, argv: Sequence[str] | None, started: float) -> dict:
    """The exact command (``python -m`` and the study's module, run from the repository root), the code's commit,
    this invocation's wall time and the machine it ran on."""
    args = sys.argv[1:] if argv is None else list(argv)
    return dict(command=f'python -m {module} {shlex.join(args)}'.rstrip(), code=code_version(),
                wall_minutes=round((time.perf_counter() - started) / 60, 1), torch=torch.__version__,
                threads=torch.get_num_threads(), cpu=platform.processor() or platform.machine(),
                date=time.strftime('%Y-%m-%d'))


def study_dir(name: str) -> Path:
    """Where a study keeps its runs by default: outside the clone (``$CPVT_CACHE_DIR``, default
    ~/.cache/cpvt_backbones), so a fresh checkout resumes a study a previous one started."""
    return Path(os.environ.get('CPVT_CACHE_DIR', Path.home() / '.cache' / 'cpvt_backbones')) / name


def parse_shard(parser: argparse.ArgumentParser, text: str) -> tuple[int, int]:
    """``'K/N'`` -> (K, N) with 0 <= K < N, or a parser error."""
    try:
        index, count = map(int, text.split('/'))
        if 0 <= index < count:
            return index, count
    except ValueError:
        pass
    parser.error(f'--shard must be K/N with 0 <= K < N, got {text!r}')


def add_run_options(parser: argparse.ArgumentParser, root: Path) -> None:
    """The options every trained study takes: ``--device`` and ``--tf32`` (one device per study; TF32 off by
    default, full float32), ``--jobs`` and ``--threads`` (processes and torch threads per run), ``--work-dir``
    (runs go to WORK_DIR/NAME/, default ``root``/benchmarks/results/recipe_runs) and ``--out`` (reports)."""
    from .config import TF32
    parser.add_argument('--device', default='cpu', help='torch device to train and test on (one per study)')
    parser.add_argument('--tf32', choices=TF32, default='off',
                        help='TF32 on a CUDA device (resolution_study --tf32); off: full float32, as on a CPU')
    parser.add_argument('--jobs', type=int, default=1,
                        help='processes: the drawing is spread over them, then as many runs train at once, '
                             'sharing the drawn images through one memory-mapped file')
    parser.add_argument('--threads', type=int, default=1, help='torch threads per run when --jobs > 1')
    parser.add_argument('--work-dir', type=Path, default=root / 'benchmarks/results/recipe_runs',
                        help='runs go to WORK_DIR/NAME/')
    parser.add_argument('--out', type=Path, default=root / 'benchmarks/results')
