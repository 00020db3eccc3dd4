"""ONNX export of our models with dynamic batch, height and width, and its check against PyTorch (torch, with
onnxscript for exporting and onnxruntime for checking)."""
from collections.abc import Sequence

import torch
from torch import nn

from ..compat import FEATURES, supports
from ..utils import atomic_write
from .check import trace_size

OPSET = 18
OPSET_TORCHSCRIPT = 17  # the newest opset torch 2.1's TorchScript exporter writes


def export(model: nn.Module, path: str, names: Sequence[str], size=(224, 224), in_chans: int = 3) -> None:
    """Write ``path`` (input ``image``: ``in_chans`` channels; outputs ``names``) with dynamic batch, height and
    width: through ``torch.export`` (``torch.onnx.export(..., dynamo=True)``, opset 18) where this torch has
    ``torch.export.Dim.DYNAMIC`` (2.6 and newer), else through the TorchScript exporter with ``dynamic_axes``
    (opset 17), which gives the same outputs. Traced at ``size`` raised to the model's ``min_trace_side``
    (``deploy.check.trace_size``)."""
    x = torch.randn(2, in_chans, *trace_size(model, size))
    with torch.no_grad():
        if supports('export'):
            dynamic = torch.export.Dim.DYNAMIC
            program = torch.onnx.export(model, (x,), dynamo=True, opset_version=OPSET, input_names=['image'],
                                        output_names=list(names),
                                        dynamic_shapes=({0: dynamic, 2: dynamic, 3: dynamic},),
                                        optimize=True, verbose=False)
            program.save(path)
            return
        outputs = model(x)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        axes = {'image': {0: 'batch', 2: 'height', 3: 'width'}}
        axes.update((name, {d: f'{name}_{d}' for d in range(out.ndim)})
                    for name, out in zip(names, outputs, strict=True))
        try:
            atomic_write(path, lambda f: torch.onnx.export(
                model, (x,), f, opset_version=OPSET_TORCHSCRIPT, input_names=['image'], output_names=list(names),
                dynamic_axes=axes))
        except torch.onnx.errors.UnsupportedOperatorError as e:  # e.g. the learned table's antialiased resize
            release, what = FEATURES['export'][:2]
            raise RuntimeError(f'exporting this model to ONNX needs torch >= {release} ({what}): torch '
                               f'{torch.__version__}\'s TorchScript exporter cannot write one of its operations '
                               f'({e})') from e


def verify(model: nn.Module, path: str, sizes: Sequence[tuple[int, int]], batch: int = 1) -> float:
    """Largest absolute difference between onnxruntime and PyTorch over ``sizes``; also printed."""
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    worst = 0.
    for h, w in sizes:
        x = torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(h * 10007 + w))
        with torch.no_grad():
            ref = model(x)
        if isinstance(ref, torch.Tensor):
            ref = (ref,)
        got = session.run(None, {'image': x.numpy()})
        if len(got) != len(ref):
            raise RuntimeError(f'{path}: {len(got)} outputs, PyTorch gives {len(ref)}')
        diff = 0.
        for r, g in zip(ref, got, strict=False):
            if tuple(r.shape) != g.shape:
                raise RuntimeError(f'{path} at {h}x{w}: output shape {g.shape}, PyTorch gives {tuple(r.shape)}')
            diff = max(diff, (r - torch.from_numpy(g)).abs().max().item())
        print(f'[onnx] {h}x{w}: {len(got)} outputs, max abs diff vs PyTorch {diff:.2e}')
        worst = max(worst, diff)
    return worst


__all__ = ['OPSET', 'export', 'verify']
