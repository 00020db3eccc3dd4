"""mmengine checkpoints under torch's safe loading (``torch.load(weights_only=True)``, torch >= 2.6 default).

mmengine 0.10.7 checkpoints hold its log buffers (``HistoryBuffer``) and numpy scalars; the buffers pickle
their statistics methods through ``getattr``, which the safe unpickler rightly refuses, so ``--resume``,
``tools/test.py`` and ``load_from`` fail. Instead of switching safety off we (1) pickle ``HistoryBuffer`` as a
plain constructor call on its numbers, and (2) allow exactly that class and numpy's data-only types.
Importing any adapter module applies both, so checkpoints written by a run that imported it load safely in
mmengine's own code paths too. Files written without it still fail, with torch's message naming the global.
"""
import copyreg

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def _reduce_history_buffer(buffer: HistoryBuffer):
    return HistoryBuffer, (buffer._log_history.tolist(), buffer._count_history.tolist(), buffer.max_length)


def _numpy_data_types() -> list:
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    dtypes = [type(np.dtype(t)) for t in ('float64', 'float32', 'float16', 'int64', 'int32', 'uint8', 'bool')]
    return [multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype] + dtypes


def install() -> None:
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    torch.serialization.add_safe_globals([HistoryBuffer] + _numpy_data_types())


install()
