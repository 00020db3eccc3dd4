"""mmengine checkpoints under safe loading, on every supported torch and mmengine.

mmengine checkpoints hold its log buffers (``HistoryBuffer``) and numpy scalars; the buffers pickle their
statistics methods through ``getattr``, which a safe unpickler rightly refuses. What mmengine itself does
differs by stack: 0.10.7 calls ``torch.load`` with torch's default (unsafe before torch 2.6, refusing these
files after), the OneDL fork loads with ``weights_only=True`` inside a ``safe_globals`` context and falls back
to ``weights_only=False`` with a warning when a file is refused. Importing this module (our configs opt in
through ``custom_imports``) makes all of them behave alike: (1) ``HistoryBuffer`` pickles as a plain
constructor call on its numbers; (2) that class and numpy's data-only types are allowed to
``cpvt_backbones.convert.safe_load``; (3) mmengine's loader of local checkpoint files (``--resume``,
``load_from``, ``tools/test.py``'s checkpoint, ``init_detector``) is ``safe_load``, so a file that would run
code is refused on every stack, with the message naming the global. Files written without (1) fail the same
way. numpy's types are allowed under numpy 1.x's names and numpy 2's (``convert.io.global_names``), so a
checkpoint written on one stack's numpy loads on another's.

It also makes local checkpoint writes atomic: mmengine's ``LocalBackend.put`` opens the target path and
writes into it, so a crash or SIGKILL part-way leaves a truncated ``iter_N.pth`` that ``--resume`` then picks.
``AtomicLocalBackend`` writes through ``cpvt_backbones.utils.atomic_write`` (a temporary file in the same
directory, fsynced and renamed over the target), so the file is either the old one, absent, or complete; it
replaces mmengine's ``local`` backend on import.
"""
import copyreg
import os
from pathlib import Path

from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from ..convert import allow_globals, safe_load
from ..convert.io import numpy_data_types
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
    """mmengine's local checkpoint loader, through ``safe_load``."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return safe_load(filename, map_location=map_location)


def install() -> None:
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    allow_globals([HistoryBuffer] + numpy_data_types())
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
    register_backend('local', AtomicLocalBackend, force=True, prefixes='')


install()
