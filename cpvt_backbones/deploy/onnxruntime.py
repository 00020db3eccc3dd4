"""onnxruntime as a CPU engine: a built model exported to ONNX once (batch, height and width dynamic,
``deploy.onnx.export``), checked against torch at another size, and run by an ``InferenceSession`` behind the
call contract of the module it came from (an NCHW float tensor in; the same tensor, tuple, list or dict of
tensors out, float32 on the CPU); int8 through onnxruntime's static quantization of that export.

The model may be a backbone, a classifier, or an OpenMMLab model's backbone + neck + head in tensor mode
(``deploy.openmmlab.TensorForward``). Precisions: float32, and int8 (``quantize``: the linear layers, static,
calibrated). ``cache``: an ``.onnx`` path where the result is saved and read instead of made again when it is
there and its record (the file's sha256 and the ``check.model_fingerprint`` of the model it was made from,
written beside it) matches; one that does not, or that was made from another model, is made again with a warning
saying why, never run. The engine is optional (``pip install onnxruntime onnxscript``, which ``make env`` installs).
"""
import ast
import json
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..utils import atomic_write, checksum_problem, file_sha256
from .check import check_against_torch, model_fingerprint, source_problem
from .onnx import export
from .precision import check_precision

INSTALL = 'pip install onnxruntime onnxscript'


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


def _saved(path: Path, write: Callable[[Path], None], what: str, source: str | None = None) -> Path:
    """``path`` where it matches its record (and, given ``source``, the record says it was made from the model of
    that fingerprint), else ``write`` it (to a temporary name, then renamed) and record it; a file that fails its
    record is written again with a warning naming it and why."""
    problem = checksum_problem(record_path(path), dict(onnx=path)) if path.is_file() else None
    if path.is_file() and problem is None and source is not None:
        problem = source_problem(record_path(path), source)
    if problem:
        warnings.warn(f'onnxruntime cache {path}: {problem}; {what} again', RuntimeWarning, stacklevel=3)
    if problem or not path.is_file():
        tmp = path.with_name(f'.{path.name}.writing')
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        record_path(path).unlink(missing_ok=True)
        tmp.replace(path)
        atomic_write(record_path(path), json.dumps(dict(onnx=file_sha256(path), source=source)).encode())
    return path


def _module_of(node) -> str | None:
    """The name (as in ``named_modules``) of the module a node of our export comes from: torch.export's
    ``pkg.torch.onnx.name_scopes`` metadata, else the TorchScript exporter's node name ``/a/b/c/Op``."""
    for prop in node.metadata_props:
        if prop.key == 'pkg.torch.onnx.name_scopes':
            scopes = ast.literal_eval(prop.value)
            return scopes[-2] if len(scopes) > 1 else ''
    return '.'.join(node.name.strip('/').split('/')[:-1]) if node.name.startswith('/') else None


def linear_nodes(path, keep_fp32: Sequence[str] = ()) -> list[str]:
    """The export's nodes that are linear layers (``aten.linear`` in torch.export's metadata; with the TorchScript
    exporter, a MatMul or Gemm whose weight is a constant), less those of modules under a ``keep_fp32`` prefix:
    what int8 quantizes, the scope of the fused engine's int8 (attention products, norms and convolutions stay
    float32)."""
    import onnx
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == 'Constant'
                                                        for o in n.output}
    names = []
    for node in graph.node:
        if node.op_type not in ('MatMul', 'Gemm'):
            continue
        traced = [p.value for p in node.metadata_props if p.key == 'pkg.torch.onnx.fx_node']
        if not (('aten.linear' in traced[0]) if traced else node.input[1] in constants):
            continue
        module = _module_of(node)
        if module is not None and any(module == k or module.startswith(k + '.') for k in keep_fp32):
            continue
        names.append(node.name)
    return names


def quantize(source, target, calibration: Iterable[torch.Tensor], keep_fp32: Sequence[str] = ()) -> None:
    """onnxruntime's static quantization of the float32 export ``source`` into ``target``: the linear layers
    (``linear_nodes``) in QDQ form, weights int8 per output channel, activations uint8 at the min-max ranges of
    the ``calibration`` batches; weights use 7 bits (``reduce_range``), which keeps the uint8 x int8 products of
    CPUs without VNNI from saturating."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    nodes = linear_nodes(source, keep_fp32)
    if not nodes:
        raise ValueError(f'keep_fp32 {list(keep_fp32)} covers every linear layer: there is nothing to quantize')

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.batches, self.count = iter(calibration), 0

        def get_next(self):
            batch = next(self.batches, None)
            if batch is None:
                if not self.count:
                    raise ValueError('onnxruntime int8: the calibration gave no input batch')
                return None
            self.count += 1
            return {'image': np.ascontiguousarray(batch.to('cpu', torch.float32).numpy())}

    quantize_static(str(source), str(target), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=['MatMul', 'Gemm'], nodes_to_quantize=nodes)


def to_onnxruntime(model: nn.Module, precision: str = 'fp32', calibration: Iterable[torch.Tensor] | None = None,
                   keep_fp32: Sequence[str] = (), cache: str | None = None, float_cache: str | None = None,
                   threads: int | None = None, example_size: tuple[int, int] = (224, 224),
                   in_chans: int | None = None) -> OnnxRuntimeModule:
    """``model`` (evaluation mode, float32; left as it is) as an ``OnnxRuntimeModule``: exported at ``example_size``
    (``deploy.onnx.export``: any size works afterwards), for 'int8' then quantized (``quantize``: ``calibration``, an
    iterable of input batches, is required; ``keep_fp32``: module name prefixes left in float32). The float32 export is
    checked against torch at another size (``deploy.check.check_against_torch``); how far int8 may move the outputs is
    the engine's contract (docs/performance.md, the engine room). ``cache``: the ``.onnx`` path of the result;
    ``float_cache``: that of the float32 export int8 starts from (default: a temporary file); both are read instead of
    made again when their record matches. ``threads``: onnxruntime's intra-op threads (default: torch's). ``in_chans``:
    input channels (default: the model's ``in_chans`` attribute, else 3)."""
    check_precision(precision)
    if precision not in ('fp32', 'int8'):
        raise ValueError(f'the onnxruntime engine runs fp32 and int8, not {precision!r} (deploy.ENGINES lists which '
                         'engine runs which precision)')
    if precision == 'int8' and calibration is None:
        raise ValueError('onnxruntime int8 is static: give calibration, an iterable of input batches')
    if model.training:
        raise ValueError('to_onnxruntime exports a model in evaluation mode: call model.eval() first')
    _onnxruntime()
    in_chans = in_chans or getattr(model, 'in_chans', 3)
    with torch.no_grad():
        _, spec = pytree.tree_flatten(model(torch.randn(1, in_chans, 32, 32)))
    names = [f'out{i}' for i in range(spec.num_leaves)]
    folder = tempfile.TemporaryDirectory(prefix='cpvt_onnxruntime-')
    exported = float_cache if precision == 'int8' else cache
    source = model_fingerprint(model) if exported or cache else None

    def write_export(path: Path) -> None:
        export(model, str(path), names, example_size, in_chans=in_chans)
    onnx_file = _saved(Path(exported) if exported else Path(folder.name) / 'model.onnx', write_export, 'exporting',
                       source)
    engine = OnnxRuntimeModule(str(onnx_file), spec, in_chans, threads)
    check_against_torch(engine, model, in_chans, 'onnxruntime export')
    if precision == 'int8':
        path = _saved(Path(cache) if cache else Path(folder.name) / 'model.int8.onnx',
                      lambda target: quantize(onnx_file, target, calibration, keep_fp32), 'quantizing', source)
        engine = OnnxRuntimeModule(str(path), spec, in_chans, threads)
    engine.folder = folder  # removed with the module
    return engine


__all__ = ['INSTALL', 'OnnxRuntimeModule', 'linear_nodes', 'quantize', 'record_path', 'to_onnxruntime']
