"""mmengine checkpoints under safe loading, alike on every supported torch and mmengine (what each stack does
without it: docs/openmmlab.md), and atomic checkpoint writes.

Importing this module (our configs opt in through ``custom_imports``): (1) mmengine's ``HistoryBuffer`` pickles
as a plain constructor call on its numbers; (2) that class and numpy's data-only types (under numpy 1.x's and
2's names) are allowed to ``cpvt_backbones.convert.safe_load``; (3) mmengine's loader of local checkpoint files
(``--resume``, ``load_from``, ``tools/test.py``'s checkpoint, ``init_detector``) is ``safe_load``: a file that
would run code, or one written without (1), is refused, naming the global, and an empty, truncated or corrupt
file is named in one line (``convert.io.read_weight_file``); (4) ``AtomicLocalBackend`` replaces
mmengine's ``local`` backend: a checkpoint file is the old one, absent, or complete, even after a crash.
"""
import copyreg
import os
from pathlib import Path

from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from ..convert import allow_globals, safe_load
from ..convert.io import numpy_data_types, read_weight_file
from ..utils import atomic_write


def _reduce_history_buffer(buffer: HistoryBuffer):
    return HistoryBuffer, (buffer._log_history.tolist(), buffer._count_history.tolist(), buffer.max_length)


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend with all-or-nothing writes (``atomic_write``)."""

    def put(self, obj: bytes, filepath: str | Path) -> None:
        atomic_write(filepath, obj)

    def put_text(self, obj: str, filepath: str | Path, encoding: str = 'utf-8') -> None:
        atomic_write(filepath, obj.encode(encoding))


def load_from_local(filename: str, map_location=None):
    """mmengine's local checkpoint loader, through ``safe_load`` (``convert.io.read_weight_file``: an empty,
    truncated or corrupt file is a ``WeightFileError`` naming it)."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return read_weight_file(filename, lambda path: safe_load(path, map_location=map_location))


def install() -> None:
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    allow_globals([HistoryBuffer] + numpy_data_types())
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
    register_backend('local', AtomicLocalBackend, force=True, prefixes='')


install()
