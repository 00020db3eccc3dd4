"""onnxruntime as a CPU engine: a built model exported to ONNX once (batch, height and width dynamic,
``deploy.onnx.export``), checked against torch at another size, and run by an ``InferenceSession`` behind the
call contract of the module it came from (an NCHW float tensor in; the same tensor, tuple, list or dict of
tensors out, float32 on the CPU).

The model may be a backbone, a classifier, or an OpenMMLab model's backbone + neck + head in tensor mode
(``deploy.openmmlab.TensorForward``). Precision: float32 only. ``cache``: an ``.onnx`` path where the export is
saved and read instead of exporting when it is there and its record (the file's sha256, written beside it)
matches; one that does not is exported again with a warning saying why. The engine is optional (``pip install
onnxruntime``, which ``make env`` installs).
"""
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..utils import atomic_write, checksum_problem, file_sha256
from .check import check_against_torch
from .onnx import export
from .precision import check_precision

INSTALL = 'pip install onnxruntime'


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(f'the onnxruntime engine needs onnxruntime: {INSTALL}') from e
    return onnxruntime


class OnnxRuntimeModule(nn.Module):
    """An onnxruntime session with the call contract of the module it was exported from. ``forward(x)`` takes an
    NCHW float tensor (any batch, height and width) and returns CPU float32 tensors in the original output
    structure. onnxruntime's ``run`` may be called from several threads at once."""

    def __init__(self, path: str, out_spec, in_chans: int, threads: int | None = None):
        super().__init__()
        ort = _onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        self.path, self.out_spec, self.in_chans = str(path), out_spec, in_chans
        self.session = ort.InferenceSession(self.path, options, providers=['CPUExecutionProvider'])
        self.eval()

    def forward(self, x: torch.Tensor):
        from ..models.base import check_input
        check_input(x, self.in_chans)
        array = np.ascontiguousarray(x.detach().to('cpu', torch.float32).numpy())
        outs = self.session.run(None, {'image': array})
        return pytree.tree_unflatten([torch.from_numpy(o) for o in outs], self.out_spec)

    def extra_repr(self) -> str:
        return f'path={self.path!r}'


def record_path(path) -> Path:
    """The record beside a saved export: ``NAME.onnx.sha256``, the file's sha256."""
    return Path(str(path) + '.sha256')


def to_onnxruntime(model: nn.Module, precision: str = 'fp32', cache: str | None = None,
                   threads: int | None = None, example_size: tuple[int, int] = (224, 224),
                   in_chans: int | None = None) -> OnnxRuntimeModule:
    """``model`` (evaluation mode, float32; left as it is) as an ``OnnxRuntimeModule``: exported at
    ``example_size`` (any size works afterwards) to ``cache`` or a file beside nothing (a temporary folder),
    checked against torch at another size (``deploy.check.check_against_torch``). ``precision``: 'fp32' only (see
    ``deploy.ENGINES``). ``threads``: onnxruntime's intra-op threads (default: torch's). ``in_chans``: input
    channels (default: the model's ``in_chans`` attribute, else 3)."""
    check_precision(precision)
    if precision != 'fp32':
        raise ValueError(f'the onnxruntime engine runs fp32, not {precision!r} (deploy.ENGINES lists which engine '
                         'runs which precision)')
    if model.training:
        raise ValueError('to_onnxruntime exports a model in evaluation mode: call model.eval() first')
    _onnxruntime()
    in_chans = in_chans or getattr(model, 'in_chans', 3)
    with torch.no_grad():
        _, spec = pytree.tree_flatten(model(torch.randn(1, in_chans, 32, 32)))
    names = [f'out{i}' for i in range(spec.num_leaves)]
    if cache is None:
        import tempfile
        folder = tempfile.TemporaryDirectory(prefix='cpvt_onnxruntime-')
        path = Path(folder.name) / 'model.onnx'
        export(model, str(path), names, example_size, in_chans=in_chans)
        engine = OnnxRuntimeModule(str(path), spec, in_chans, threads)
        engine.folder = folder  # removed with the module
    else:
        path = Path(cache)
        problem = checksum_problem(record_path(path), dict(onnx=path)) if path.is_file() else None
        if problem:
            warnings.warn(f'onnxruntime cache {path}: {problem}; exporting again', RuntimeWarning, stacklevel=2)
        if problem or not path.is_file():
            tmp = path.with_name(f'.{path.name}.exporting')
            path.parent.mkdir(parents=True, exist_ok=True)
            export(model, str(tmp), names, example_size, in_chans=in_chans)
            record_path(path).unlink(missing_ok=True)
            tmp.replace(path)
            atomic_write(record_path(path), json.dumps(dict(onnx=file_sha256(path))).encode())
        engine = OnnxRuntimeModule(str(path), spec, in_chans, threads)
    check_against_torch(engine, model, in_chans, 'onnxruntime')
    return engine


__all__ = ['INSTALL', 'OnnxRuntimeModule', 'record_path', 'to_onnxruntime']
