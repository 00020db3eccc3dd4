"""The onnxruntime engine: ``prepare(model, 'onnxruntime', precision)`` exports ``model`` to ONNX once and returns
an ``OnnxRuntimeModule`` (``_prepare``); int8 through onnxruntime's static quantization (``quantize``). ``model``:
a backbone, a classifier, or an OpenMMLab model in tensor mode (``deploy.openmmlab.TensorForward``). Needs
``pip install onnxruntime onnxscript``.
"""
import ast
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..check import check_against_torch, check_example_size
from ..onnx import export
from ..registry import Engine, EngineModule, in_chans_of, register, under

INSTALL = 'pip install onnxruntime onnxscript'


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(f'the onnxruntime engine needs onnxruntime: {INSTALL}') from e
    return onnxruntime


class OnnxRuntimeModule(EngineModule, nn.Module):
    """An onnxruntime session with the call contract of the module it was exported from. ``forward(x)`` takes an
    NCHW float tensor (any batch, height and width) and returns CPU float32 tensors in the original output
    structure. onnxruntime's ``run`` may be called from several threads at once."""

    engine = 'onnxruntime'

    def __init__(self, path: str, out_spec, in_chans: int, threads: int | None = None):
        super().__init__()
        ort = _onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        self.path, self.out_spec, self.in_chans = str(path), out_spec, in_chans
        self.session = ort.InferenceSession(self.path, options, providers=['CPUExecutionProvider'])
        self.eval()

    def forward(self, x: torch.Tensor):
        from ...models.base import check_input
        check_input(x, self.in_chans)
        array = x.detach().to('cpu', torch.float32).contiguous().numpy()
        outs = self.session.run(None, {'image': array})
        return pytree.tree_unflatten([torch.from_numpy(o) for o in outs], self.out_spec)

    def extra_repr(self) -> str:
        return f'path={self.path!r}'


def _made(artifact, folder: Path, name: str, write: Callable[[Path], None]) -> Path:
    """The file of ``artifact`` where it is saved and holds for the model, else written by ``write`` and saved
    there (``deploy.artifacts``); with no artifact, or where it cannot be saved, written in ``folder``."""
    path = artifact.load() if artifact is not None else None
    if path is None and artifact is not None:
        path = artifact.save(write)
    if path is None:
        path = folder / name
        write(path)
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
        if module is not None and under(module, keep_fp32):
            continue
        names.append(node.name)
    return names


def quantize(source, target, calibration: Iterable[torch.Tensor], keep_fp32: Sequence[str] = ()) -> None:
    """onnxruntime's static quantization of the float32 export ``source`` into ``target``: the linear layers
    (``linear_nodes``) in QDQ form, weights int8 per output channel, activations uint8 at the min-max ranges of
    the ``calibration`` batches; weights use 7 bits (``reduce_range``: no saturating products without VNNI)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    nodes = linear_nodes(source, keep_fp32)
    if not nodes:
        raise ValueError(f'keep_fp32 {list(keep_fp32)} covers every linear layer: there is nothing to quantize')

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(calibration)

        def get_next(self):
            batch = next(self.batches, None)
            if batch is None:
                return None
            return {'image': batch.to('cpu', torch.float32).contiguous().numpy()}

    quantize_static(str(source), str(target), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=['MatMul', 'Gemm'], nodes_to_quantize=nodes)


def _prepare(model: nn.Module, request, calibration, cache) -> OnnxRuntimeModule:
    """``model`` (left as it is) as an ``OnnxRuntimeModule``: exported at the option ``example_size`` (224 x 224,
    ``deploy.onnx.export``: any size works afterwards) and checked against torch at another size
    (``deploy.check.check_against_torch``), at int8 then quantized (``quantize``, on ``calibration``; the modules
    under ``request.keep_fp32`` stay float32); how far int8 may move the outputs is the engine's contract
    (docs/performance.md, the engine room). ``cache``: the export (``conversion``) and the quantized model
    (``result``) are read instead of made where they hold for this model (``deploy.artifacts``). Options:
    ``threads``, onnxruntime's intra-op threads (default: torch's); ``in_chans`` (default: the model's, else 3)."""
    _onnxruntime()
    in_chans = in_chans_of(model, request.options)
    example_size = check_example_size(model, request.options.get('example_size', (224, 224)))
    threads = request.options.get('threads')
    with torch.no_grad():
        _, spec = pytree.tree_flatten(model(torch.randn(1, in_chans, 32, 32)))
    names = [f'out{i}' for i in range(spec.num_leaves)]
    folder = tempfile.TemporaryDirectory(prefix='cpvt_onnxruntime-')
    exported = _made(cache.conversion('.onnx'), Path(folder.name), 'model.onnx',
                     lambda path: export(model, str(path), names, example_size, in_chans=in_chans))
    prepared = OnnxRuntimeModule(str(exported), spec, in_chans, threads)
    check_against_torch(prepared, model, in_chans, 'onnxruntime export')
    if request.precision == 'int8':
        quantized = _made(cache.result('.onnx'), Path(folder.name), 'model.int8.onnx',
                          lambda target: quantize(exported, target, calibration, request.keep_fp32))
        prepared = OnnxRuntimeModule(str(quantized), spec, in_chans, threads)
    prepared.folder = folder  # removed with the module
    return prepared


def _validate(precision: str, options) -> None:
    if 'example_size' in options:
        check_example_size(None, options['example_size'])
    threads = options.get('threads')
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f'engine onnxruntime: threads must be a positive int, got {threads!r}')


register(Engine(
    'onnxruntime', 'model', {'fp32': 'everything',
                             'int8': 'all but the linear layers (attention products, norms, convolutions), linear '
                                     'layers in keep_fp32'},
    _prepare, 'onnxruntime (CPU provider) on the ONNX export with dynamic batch, height and width '
              "(deploy.engines.onnxruntime); int8: onnxruntime's static quantization, activations at ranges calibrated "
              'on input batches',
    requires=('onnxruntime', 'onnxscript'), install=INSTALL, calibrated=('int8',),
    options=('threads', 'example_size', 'in_chans'), validate=_validate, run_options=('threads',)))

__all__ = ['INSTALL', 'OnnxRuntimeModule', 'linear_nodes', 'quantize']
