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
``AtomicLocalBackend`` writes through ``cpvt_backbones.utils.atomic_write`` (a temporary file in the same
directory, fsynced and renamed over the target), so the file is either the old one, absent, or complete; it
replaces mmengine's ``local`` backend on import.
"""
import copyreg
from pathlib import Path
from typing import Union

import numpy as np
import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer

from ..utils import atomic_write


def _reduce_history_buffer(buffer: HistoryBuffer):
    return HistoryBuffer, (buffer._log_history.tolist(), buffer._count_history.tolist(), buffer.max_length)


def _numpy_data_types() -> list:
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    dtypes = [type(np.dtype(t)) for t in ('float64', 'float32', 'float16', 'int64', 'int32', 'uint8', 'bool')]
    return [multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype] + dtypes


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend with all-or-nothing writes (``atomic_write``)."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write(filepath, obj)

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write(filepath, obj.encode(encoding))


def install() -> None:
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    torch.serialization.add_safe_globals([HistoryBuffer] + _numpy_data_types())
    register_backend('local', AtomicLocalBackend, force=True, prefixes='')


install()
