"""Runs spread over processes: the images drawn once, then shared by every process through one memory-mapped
file, each process with its own torch threads."""
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


__all__ = ['drawing_pool', 'map_shared']
