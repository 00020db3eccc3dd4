"""What every study does with its runs, once: the grid of runs split into shards (``Grid``), the skeleton that
runs a shard and reports once every shard's runs are done (``conduct``), and the report's files
(``write_report``)."""
import json
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from benchmarks.study.common import run_meta, write_csv

T = TypeVar('T')


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


def conduct(grid: Grid, tag: str, module: str, argv: Sequence[str] | None, work: Callable[[list], None],
            load: Callable[[Hashable], Sequence[dict]], report: Callable[[list[dict], dict], T]) -> T | None:
    """A study's invocation: ``work`` does this shard's keys not done yet (resuming each where it stopped); once
    every key of every shard is done, ``report`` gets every key's records (``load``, in grid order) and the
    invocation's meta (``run_meta`` of ``module`` and ``argv``: the command, the code's commit, the wall time) and
    its answer is returned. None while runs of other shards are pending (a line ``[tag] ...`` says which)."""
    start = time.perf_counter()
    todo = grid.todo()
    if todo:
        work(todo)
    if not grid.complete(tag):
        return None
    results = [record for key in grid.keys for record in load(key)]
    return report(results, run_meta(module, argv, start))


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


__all__ = ['Grid', 'conduct', 'write_report']
