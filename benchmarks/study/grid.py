"""What every study does with its runs, once: the grid of runs split into shards, each run resumed from what it
left (a run is done once its result.json exists) on the accelerator it started on (``start_on``), the report
written only when every shard's runs are done, and the report's files (``write_report``)."""
import json
import shutil
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.study.common import write_csv
from cpvt_backbones.utils import atomic_write


@dataclass(frozen=True)
class Grid:
    """A study's runs: ``keys`` (one per run or per group of runs a shard takes together, in a fixed order),
    ``dirs(key)`` the run folders a key's results go to, and this invocation's shard (``shard_index`` of
    ``num_shards``: every ``num_shards``-th key from the ``shard_index``-th)."""
    keys: Sequence[Hashable]
    dirs: Callable[[Hashable], Sequence[Path]]
    shard_index: int = 0
    num_shards: int = 1

    def __post_init__(self):
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(f'shard must be K/N with 0 <= K < N, got {self.shard_index}/{self.num_shards}')
        if len(set(self.keys)) != len(self.keys):
            raise ValueError('a grid lists each run once')

    def done(self, key: Hashable) -> bool:
        """Whether every run of ``key`` has written its result.json."""
        return all((d / 'result.json').is_file() for d in self.dirs(key))

    def shard(self) -> list:
        """This shard's keys, in order."""
        return list(self.keys[self.shard_index::self.num_shards])

    def todo(self) -> list:
        """This shard's keys not done yet."""
        return [k for k in self.shard() if not self.done(k)]

    def complete(self, tag: str) -> bool:
        """Whether every key of every shard is done; where not, a line (prefixed ``[tag]``) says how many runs are
        pending, named, and that the report waits for them."""
        pending = [d.name for k in self.keys for d in self.dirs(k) if not (d / 'result.json').is_file()]
        if pending:
            print(f'[{tag}] this shard is done; {len(pending)} run(s) of other shards pending '
                  f'({", ".join(pending[:6])}{" ..." if len(pending) > 6 else ""}): the report is written once every '
                  'run has finished', flush=True)
        return not pending


def start_on(run_dir: Path, stamp: dict, tag: str, label: str,
             partial: Sequence[str] = ('checkpoint.pth', 'final.pth', 'checks')) -> None:
    """Where a run starts, or resumes: ``run_dir``/started_on.json records ``stamp`` (its ``accelerator`` and
    whatever else a study ties a run to) when the run starts. A run started on another accelerator has its
    ``partial`` training (files or folders under ``run_dir``) removed and starts again from the beginning, with a
    line (``[tag] label started on ...``) saying so: a run resumes only where it started (float rounding)."""
    started = run_dir / 'started_on.json'
    if started.is_file():
        before = json.loads(started.read_text())['accelerator']
        if before != stamp['accelerator']:
            print(f'[{tag}] {label} started on {before}, not {stamp["accelerator"]}: training it again from the '
                  'start', flush=True)
            for path in (run_dir / name for name in partial):
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            started.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not started.is_file():
        atomic_write(started, json.dumps(stamp).encode())


def write_report(out: Path, name: str, document: dict, markdown: str, rows: Sequence[dict] = (),
                 figures: dict[str, Callable[[Path], None]] | None = None) -> None:
    """A study's report under ``out``: NAME.json (``document``: its meta, summary and runs), NAME.md
    (``markdown``), NAME.csv (``rows``, where any) and a figure per entry of ``figures`` (suffix -> a function
    drawing to that path: '' gives NAME.png, '_probe' NAME_probe.png)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f'{name}.json').write_text(json.dumps(document, indent=2))
    (out / f'{name}.md').write_text(markdown)
    if rows:
        write_csv(list(rows), out / f'{name}.csv')
    for suffix, draw in (figures or {}).items():
        draw(out / f'{name}{suffix}.png')


__all__ = ['Grid', 'start_on', 'write_report']
