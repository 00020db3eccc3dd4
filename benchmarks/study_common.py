"""What the resolution studies share: mean and spread over seeds, the CSV table and the run's metadata."""
import csv
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch


def mean_std(values: Sequence[float], digits: int = 2) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed)."""
    return round(statistics.mean(values), digits), round(statistics.stdev(values), digits) if len(values) > 1 else 0.


def write_csv(rows: List[Dict], path: Path) -> None:
    """The summary rows as CSV (without the per-row seed list, which the JSON keeps)."""
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != 'seeds'])
        writer.writeheader()
        writer.writerows({k: v for k, v in row.items() if k != 'seeds'} for row in rows)


def run_meta(script: str, argv: Optional[Sequence[str]], started: float) -> Dict:
    """The exact command, this invocation's wall time and the machine it ran on."""
    args = sys.argv[1:] if argv is None else list(argv)
    return dict(command=f'python {script} {shlex.join(args)}'.rstrip(),
                wall_minutes=round((time.perf_counter() - started) / 60, 1), torch=torch.__version__,
                threads=torch.get_num_threads(), cpu=platform.processor() or platform.machine(),
                date=time.strftime('%Y-%m-%d'))
