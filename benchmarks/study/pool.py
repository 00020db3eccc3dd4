"""Runs spread over processes: the images drawn once, then shared by every process through one memory-mapped
file, each process with its own torch threads (``map_shared``, ``run_all``)."""
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from multiprocessing import get_context
from pathlib import Path

import torch

_SHARED: dict = {}


def drawing_pool(jobs: int) -> AbstractContextManager:
    """A pool of ``jobs`` spawned processes to draw in (``scenes.draw``'s ``pool``), or None where ``jobs`` is 1."""
    return ProcessPoolExecutor(jobs, mp_context=get_context('spawn')) if jobs > 1 else nullcontext()


def _load(path: Path, threads: int) -> None:
    torch.set_num_threads(threads)
    _SHARED['data'] = torch.load(str(path), mmap=True)   # torch 2.1 takes mmap only with a str


def _call(fn: Callable, args: tuple):
    return fn(_SHARED['data'], *args)


def map_shared(fn: Callable, calls: Sequence[tuple], data, jobs: int, threads: int, prefix: str) -> Iterator:
    """``fn(data, *call)`` for each of ``calls``, in ``jobs`` spawned processes with ``threads`` torch threads
    each, yielding the results in order as they come. ``data`` (tensors, nested in tuples, lists and dicts) is
    saved once to a temporary folder (named ``prefix``..., removed once every call has returned) and read
    memory-mapped by every process; ``fn`` must be importable by name (a module-level function)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        path = Path(tmp) / 'drawn.pt'
        torch.save(data, path)
        with ProcessPoolExecutor(jobs, mp_context=get_context('spawn'), initializer=_load,
                                 initargs=(path, threads)) as pool:
            yield from pool.map(_call, [fn] * len(calls), calls)


def run_all(fn: Callable, calls: Sequence[tuple], data, jobs: int, threads: int, tag: str) -> None:
    """``fn(data, *call)`` for each of ``calls``: one after another in this process where ``jobs`` is 1, else in
    ``jobs`` processes sharing ``data`` (``map_shared``), a line ``[tag] NAME finished`` as each returns its run's
    NAME."""
    if jobs == 1:
        for call in calls:
            fn(data, *call)
        return
    for done in map_shared(fn, calls, data, jobs, threads, f'{tag}-'):
        print(f'[{tag}] {done} finished', flush=True)


__all__ = ['drawing_pool', 'map_shared', 'run_all']
