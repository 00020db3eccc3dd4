"""ONNX export of our models with dynamic batch, height and width, and its check against PyTorch (torch, with
onnxscript for exporting and onnxruntime for checking)."""
from collections.abc import Sequence

import torch
from torch import nn

from ..compat import FEATURES, supports
from ..utils import atomic_write
from .check import WithSizes, check_sized_conversion, trace_size

OPSET = 18
OPSET_TORCHSCRIPT = 17  # the newest opset torch 2.1's TorchScript exporter writes


def export(model: nn.Module, path: str, names: Sequence[str], size=(224, 224), in_chans: int = 3,
           sizes_input: bool = False) -> None:
    """Write ``path`` (input ``image``: ``in_chans`` channels; outputs ``names``) with dynamic batch, height and
    width: through ``torch.export`` (``torch.onnx.export(..., dynamo=True)``, opset 18) where this torch has
    ``torch.export.Dim.DYNAMIC`` (2.6 and newer), else through the TorchScript exporter with ``dynamic_axes``
    (opset 17), which gives the same outputs. Traced at ``size`` raised to the model's ``min_trace_side``
    (``deploy.check.trace_size``). ``sizes_input``: a second input ``sizes``, (N, 2) int64, each image's valid
    (height, width) in pixels from the top-left of the padded batch ``image``, handed to the model's forward as
    ``valid_sizes``; a TypeError or a ``deploy.check.PerImagePathError`` naming the module before anything is
    written where the model's valid-size path cannot be recorded (``deploy.check.check_sized_conversion``)."""
    if sizes_input:
        check_sized_conversion(model, in_chans, 'exported with a sizes input')
        model = WithSizes(model)
    hw = trace_size(model, size)
    x = torch.randn(2, in_chans, *hw)
    inputs = (x, torch.tensor([list(hw), [hw[0] // 2 + 1, hw[1]]])) if sizes_input else (x,)
    input_names = ['image', 'sizes'][:len(inputs)]
    with torch.no_grad():
        if supports('export'):
            dynamic = torch.export.Dim.DYNAMIC
            shapes = ({0: dynamic, 2: dynamic, 3: dynamic}, {0: dynamic})[:len(inputs)]
            program = torch.onnx.export(model, inputs, dynamo=True, opset_version=OPSET, input_names=input_names,
                                        output_names=list(names), dynamic_shapes=shapes, optimize=True,
                                        verbose=False)
            program.save(path)
            return
        outputs = model(*inputs)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        axes = {'image': {0: 'batch', 2: 'height', 3: 'width'}, **({'sizes': {0: 'batch'}} if sizes_input else {})}
        axes.update((name, {d: f'{name}_{d}' for d in range(out.ndim)})
                    for name, out in zip(names, outputs, strict=True))
        try:
            atomic_write(path, lambda f: torch.onnx.export(
                model, inputs, f, opset_version=OPSET_TORCHSCRIPT, input_names=input_names,
                output_names=list(names), dynamic_axes=axes))
        except torch.onnx.errors.UnsupportedOperatorError as e:  # e.g. the learned table's antialiased resize
            release, what = FEATURES['export'][:2]
            raise RuntimeError(f'exporting this model to ONNX needs torch >= {release} ({what}): torch '
                               f'{torch.__version__}\'s TorchScript exporter cannot write one of its operations '
                               f'({e})') from e


def verify(model: nn.Module, path: str, sizes: Sequence[tuple[int, int]], batch: int = 1) -> float:
    """Largest absolute difference between onnxruntime and PyTorch over ``sizes``; also printed. A file with a
    ``sizes`` input (``export(..., sizes_input=True)``) runs, at each size, ``batch`` random images filling the
    batch, then all of ``sizes`` together as one padded batch (bottom/right, to the largest height and width; its
    padding random), each image's region of every output against ``model`` on that image alone, and zeros beyond
    it."""
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    sized = [i.name for i in session.get_inputs()] == ['image', 'sizes']
    in_chans = session.get_inputs()[0].shape[1]
    in_chans = in_chans if isinstance(in_chans, int) else 3
    worst = 0.
    for h, w in sizes:
        x = torch.randn(batch, in_chans, h, w, generator=torch.Generator().manual_seed(h * 10007 + w))
        feed = {'image': x.numpy()}
        if sized:
            feed['sizes'] = torch.tensor([[h, w]] * batch).numpy()
        expected = _outputs(model, x)
        diff = _compare(path, f'{h}x{w}', expected, session.run(None, feed))
        print(f'[onnx] {h}x{w}: {len(expected)} outputs, max abs diff vs PyTorch {diff:.2e}')
        worst = max(worst, diff)
    if sized and len(sizes) > 1:
        generator = torch.Generator().manual_seed(len(sizes))
        images = [torch.randn(1, in_chans, h, w, generator=generator) for h, w in sizes]
        padded = torch.randn(len(sizes), in_chans, max(h for h, _ in sizes), max(w for _, w in sizes),
                             generator=generator)
        for i, (h, w) in enumerate(sizes):
            padded[i, :, :h, :w] = images[i][0]
        got = session.run(None, {'image': padded.numpy(), 'sizes': torch.tensor(list(sizes)).numpy()})
        diff = 0.
        for i, image in enumerate(images):
            alone = _outputs(model, image)
            region = [torch.from_numpy(g)[i:i + 1] for g in got]
            cropped = [g[(..., *(slice(0, n) for n in a.shape[2:]))] if g.ndim == a.ndim else g
                       for g, a in zip(region, alone, strict=False)]
            diff = max(diff, _compare(path, f'image {i} ({tuple(sizes[i])}) of the padded batch', alone,
                                      [c.numpy() for c in cropped]))
            for g, a in zip(region, alone, strict=False):
                beyond = g.clone()
                beyond[(..., *(slice(0, n) for n in a.shape[2:]))] = 0
                if g.ndim == a.ndim and beyond.abs().max() > 0:
                    raise RuntimeError(f'{path}: image {i} of the padded batch has non-zero outputs beyond its '
                                       f'valid size {tuple(sizes[i])}')
        print(f'[onnx] padded batch of {", ".join(f"{h}x{w}" for h, w in sizes)}: max abs diff vs each image alone '
              f'in PyTorch {diff:.2e}')
        worst = max(worst, diff)
    return worst


def _outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(x)
    return [out] if isinstance(out, torch.Tensor) else list(out)


def _compare(path: str, where: str, expected: Sequence[torch.Tensor], got: Sequence) -> float:
    """Largest absolute difference between ``expected`` (PyTorch's) and ``got`` (the file's, numpy arrays); a
    RuntimeError naming ``where`` for another number of outputs or another shape."""
    if len(got) != len(expected):
        raise RuntimeError(f'{path}: {len(got)} outputs, PyTorch gives {len(expected)}')
    diff = 0.
    for r, g in zip(expected, got, strict=True):
        if tuple(r.shape) != tuple(g.shape):
            raise RuntimeError(f'{path} at {where}: output shape {tuple(g.shape)}, PyTorch gives {tuple(r.shape)}')
        diff = max(diff, (r - torch.from_numpy(g)).abs().max().item())
    return diff


__all__ = ['OPSET', 'export', 'verify']
