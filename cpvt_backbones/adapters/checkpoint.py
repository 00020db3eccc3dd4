"""mmengine checkpoints under torch's safe loading (``torch.load(weights_only=True)``, torch >= 2.6 default).

mmengine 0.10.7 checkpoints hold its log buffers (``HistoryBuffer``) and numpy scalars; the buffers pickle
their statistics methods through ``getattr``, which the safe unpickler rightly refuses, so ``--resume``,
``tools/test.py`` and ``load_from`` fail. Instead of switching safety off we (1) pickle ``HistoryBuffer`` as a
plain constructor call on its numbers, and (2) allow exactly that class and numpy's data-only types.
Importing this module applies both (our configs opt in through ``custom_imports``), so checkpoints written by
a run that imported it load safely in mmengine's own code paths too. Files written without it still fail,
with torch's message naming the global.

It also makes local checkpoint writes atomic: mmengine's ``LocalBackend.put`` opens the target path and
writes into it, so a crash or SIGKILL part-way leaves a truncated ``iter_N.pth`` that ``--resume`` then picks.
``AtomicLocalBackend`` writes a temporary file in the same directory, fsyncs it and renames it over the target,
so the file is either the old one, absent, or complete; it replaces mmengine's ``local`` backend on import.
"""
import copyreg
import os
import tempfile
from pathlib import Path
from typing import Union

import numpy as np
import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer


def _reduce_history_buffer(buffer: HistoryBuffer):
    return HistoryBuffer, (buffer._log_history.tolist(), buffer._count_history.tolist(), buffer.max_length)


def _numpy_data_types() -> list:
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    dtypes = [type(np.dtype(t)) for t in ('float64', 'float32', 'float16', 'int64', 'int32', 'uint8', 'bool')]
    return [multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype] + dtypes


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(data: bytes, path: Union[str, Path]) -> None:
    """Write ``data`` to ``path`` so that no reader (or crash) ever sees a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.part', dir=path.parent)
    try:
        with os.fdopen(fd, 'wb') as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)  # mkstemp's 0600 would outlive the rename
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend with all-or-nothing writes (``atomic_write``)."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write(obj.encode(encoding), filepath)


def install() -> None:
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    torch.serialization.add_safe_globals([HistoryBuffer] + _numpy_data_types())
    register_backend('local', AtomicLocalBackend, force=True, prefixes='')


install()
