"""The OpenVINO engine: ``prepare(model, 'openvino', precision)`` converts ``model`` once (``convert``), compiles
it for the CPU and returns an ``OpenVINOModule`` with ``model``'s call contract. ``model`` is any float32 module
mapping one NCHW image batch to a tensor, tuple, list or dict of tensors (an OpenMMLab model in tensor mode:
``deploy.openmmlab``). Precisions:

* ``'fp32'``: float32 throughout;
* ``'bf16'``: OpenVINO's bf16 inference precision where the CPU plugin runs bf16 natively, else float32 with a
  RuntimeWarning (``compile_config``);
* ``'int8'``: NNCF post-training quantization on ``calibration`` (``quantize``), the modules under ``keep_fp32``
  float32.

The option ``sizes_input=True`` converts the model with each image's valid size as a second input
(``SizedOpenVINOModule``; ``check_sized_conversion`` says which models can be), as ``bucket=`` needs.

Needs ``pip install 'cpvt_backbones[openvino]'``; without it the first call raises an ImportError naming it.
"""
import collections
import contextlib
import json
import logging
import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ...compat import require
from ..check import WithSizes, check_against_torch, check_example_size, check_sized_conversion, trace_size
from ..registry import Engine, EngineModule, in_chans_of, register, under

SHAPES = ('dynamic', 'static', 'auto')
EXTRA = "pip install 'cpvt_backbones[openvino]'"


def _openvino():
    try:
        import openvino
    except ImportError as e:
        raise ImportError(f'the OpenVINO engine needs the openvino package, which is not installed: {EXTRA} '
                          f'(make env installs it)') from e
    return openvino


def _nncf():
    try:
        import nncf
    except ImportError as e:
        raise ImportError(f'int8 on OpenVINO quantizes with NNCF, which is not installed: {EXTRA}') from e
    return nncf


def available() -> bool:
    """True when the openvino package imports."""
    try:
        _openvino()
    except ImportError:
        return False
    return True


def native_bf16() -> bool:
    """True when OpenVINO's CPU plugin runs bf16 natively here (avx512_bf16 or AMX)."""
    ov = _openvino()
    return 'BF16' in ov.Core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES')


def compile_config(precision: str, threads: int | None = None) -> dict[Any, Any]:
    """The CPU plugin's properties for ``precision``: the inference precision (bf16 only where native, with a
    warning otherwise) and, if given, the number of threads."""
    ov = _openvino()
    kind = ov.Type.f32   # named explicitly: the plugin's default is bf16 on bf16-capable CPUs
    if precision == 'bf16':
        if native_bf16():
            kind = ov.Type.bf16
        else:
            warnings.warn("precision='bf16': this CPU has no native bf16 (OpenVINO's CPU plugin reports "
                          f"{ov.Core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES')}); running float32",
                          RuntimeWarning, stacklevel=3)
    config = {ov.properties.hint.inference_precision: kind}
    if threads:
        config[ov.properties.inference_num_threads] = int(threads)
    return config


def _aa_weights(in_size: int, out_size, kernel: Callable[[torch.Tensor], torch.Tensor], support: float,
                dtype: torch.dtype) -> torch.Tensor:
    """(out_size, in_size) resampling weights of ``F.interpolate(..., align_corners=False, antialias=True)``
    with ``kernel`` of half-width ``support``, in ``dtype``; ``out_size`` may be symbolic (tensor arithmetic
    only)."""
    scale = torch.full((), in_size, dtype=torch.float64) / out_size
    stretch = torch.clamp(scale, min=1.)
    centres = scale * (torch.arange(out_size, dtype=torch.float64) + 0.5)
    x = (torch.arange(in_size, dtype=torch.float64) + 0.5 - centres[:, None]) / stretch
    weights = torch.where(x.abs() < support, kernel(x.abs()), torch.zeros_like(x))
    return (weights / weights.sum(-1, keepdim=True)).to(dtype)


def _triangle(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(1 - x, min=0.)


def _pil_cubic(x: torch.Tensor, a: float = -0.5) -> torch.Tensor:
    """PIL's (and torch's antialiased) cubic convolution kernel, a = -0.5, for |x| < 2."""
    return torch.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a)


def _aa_resize(kernel, support):
    def resize(x, output_size, align_corners, *scales):
        if align_corners or output_size is None:
            raise NotImplementedError('antialiased resizing is decomposed for an output size with '
                                      'align_corners=False only')
        rows = _aa_weights(x.shape[-2], output_size[0], kernel, support, x.dtype)
        cols = _aa_weights(x.shape[-1], output_size[1], kernel, support, x.dtype)
        return torch.einsum('ih,nchw,jw->ncij', rows, x, cols)
    return resize


# Ops OpenVINO's PyTorch front end has no rule for, as compositions of ops it has: the antialiased resizes
# (the learned table's resampling to the input's grid, as timm does it).
DECOMPOSITIONS = {op: _aa_resize(kernel, support)
                  for packet, kernel, support in ((torch.ops.aten._upsample_bicubic2d_aa, _pil_cubic, 2.),
                                                  (torch.ops.aten._upsample_bilinear2d_aa, _triangle, 1.))
                  for op in (packet.default, packet.vec)}


def _torch_half_pixel(ov_model) -> None:
    """Set ``ov_model``'s linear and cubic resizes, in place, to PyTorch's coordinates at every output length
    ('half_pixel' for the front end's 'pytorch_half_pixel', which maps an output of length 1 to the first input
    pixel, not the centre)."""
    for op in ov_model.get_ops():
        if op.get_type_name() == 'Interpolate':
            attributes = op.get_attributes()
            if attributes['coordinate_transformation_mode'] == 'pytorch_half_pixel' and \
                    attributes['mode'] in ('linear', 'linear_onnx', 'cubic'):
                op.set_attribute('coordinate_transformation_mode', 'half_pixel')


# Where each converted operation records the module it came from (``convert``; read by ``quantize``), and where a
# saved model keeps them all (``save``, ``_read``).
MODULE_KEY = 'torch_module'
MODULES_KEY = 'cpvt_backbones_torch_modules'


def _record_modules(ov_model, graph) -> None:
    """Tag every operation of ``ov_model``, in place, with the dotted path of the innermost module of the node of
    ``graph`` it was converted from (under ``MODULE_KEY``)."""
    modules = {}
    for node in graph.nodes:
        stack = list(node.meta.get('nn_module_stack', {}).values())
        if stack:
            modules[node.name] = stack[-1][0]
    for op in ov_model.get_ops():
        path = modules.get(op.get_friendly_name().split('/', 1)[0])   # the front end names it '<FX node>/<op>'
        if path is not None:
            op.get_rt_info()[MODULE_KEY] = path


def _require_float32(model: nn.Module) -> None:
    """A TypeError unless every parameter of ``model`` is float32."""
    other = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if other:
        raise TypeError(f'the openvino engine converts a float32 model, this one has {", ".join(other)} parameters: '
                        "call model.float() first (precision='bf16' or 'int8' lowers the precision on OpenVINO's side)")


class _MissingDecomposition(logging.Filter):
    """Drops OpenVINO's record that an operation it keeps whole is not in torch's decomposition table; every other
    record passes."""
    MESSAGE = 'Operation %s not found in decomp table'   # harmless: OpenVINO asks for such an operation whole

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.MESSAGE


@contextlib.contextmanager
def _without_missing_decomposition_warnings():
    """While the ``with`` block runs, the root logger drops ``_MissingDecomposition``'s records, no others."""
    root, quiet = logging.getLogger(), _MissingDecomposition()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def convert(model: nn.Module, example: torch.Tensor, sizes_input: bool = False):
    """``model`` (evaluation mode; a TypeError unless float32) as an ``openvino.Model`` with dynamic batch, height
    and width, through ``torch.export`` (a RuntimeError on a torch without it), and the pytree spec of its
    outputs. Every operation records its module (``MODULE_KEY``). Traced at ``example``'s batch and channels and
    ``deploy.check.trace_size`` of its size (a random input where that differs). ``sizes_input``: a second
    input, each image's valid (height, width) as (B, 2) int64; a ValueError where that path does not export."""
    require('export', "converting a model to OpenVINO (prepare(model, 'openvino'))")
    ov = _openvino()
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder
    _require_float32(model)
    size = trace_size(model, tuple(example.shape[-2:]))
    if size != tuple(example.shape[-2:]):
        example = torch.randn(*example.shape[:-2], *size, dtype=example.dtype)
    dynamic = torch.export.Dim.DYNAMIC
    inputs, shapes = (example,), ({0: dynamic, 2: dynamic, 3: dynamic},)
    if sizes_input:
        inputs += (torch.tensor([list(size)] * example.shape[0]),)
        shapes += ({0: dynamic},)
    with torch.no_grad():
        try:
            program = torch.export.export(WithSizes(model) if sizes_input else model, inputs,
                                          dynamic_shapes=shapes)
        except Exception as e:
            if not sizes_input:
                raise
            raise ValueError(f'{type(model).__name__} cannot be converted with sizes_input: its valid-size path does '
                             f'not trace (a learned position table or a PEG padding other than zeros runs each '
                             f'image on its own): {type(e).__name__}: {str(e)[:300]}') from e
        if any(node.target in DECOMPOSITIONS for node in program.graph.nodes):
            program = program.run_decompositions(DECOMPOSITIONS)
        _, spec = pytree.tree_flatten(model(example))
    with _without_missing_decomposition_warnings():
        decoder = TorchFXPythonDecoder.from_exported_program(program)  # what convert_model(program) converts
    ov_model = ov.convert_model(decoder)
    _record_modules(ov_model, decoder.pt_module.graph)
    _torch_half_pixel(ov_model)
    return ov_model, spec


def ops_under(ov_model, prefixes: Sequence[str]) -> list[str]:
    """Names of the operations of ``ov_model`` (from ``convert``) that came from modules under any of
    ``prefixes`` (dotted module-name prefixes: 'bbox_head' takes 'bbox_head.retina_cls' too); a ValueError
    naming any prefix that matches nothing."""
    found, unmatched = [], set(prefixes)
    for op in ov_model.get_ops():
        info = op.get_rt_info()
        path = info[MODULE_KEY].astype(str) if MODULE_KEY in info else None
        hits = [p for p in prefixes if path is not None and under(path, [p])]
        if hits:
            found.append(op.get_friendly_name())
            unmatched -= set(hits)
    if unmatched:
        raise ValueError(f'keep_fp32: no converted operation comes from a module under {sorted(unmatched)} (module '
                         'names as in model.named_modules())')
    return found


def quantize(ov_model, calibration: Iterable[torch.Tensor], keep_fp32: Sequence[str] = (),
             subset_size: int = 300, multiple: int = 1):
    """``ov_model`` (from ``convert``) quantized to int8 by NNCF (transformer preset), calibrated on up to
    ``subset_size`` images of ``calibration``'s batches; the operations of the modules under ``keep_fp32``
    (``ops_under``) stay float. With valid sizes, each batch is zero-padded bottom/right to multiples of
    ``multiple`` (as ``SizedOpenVINOModule`` runs), every image's valid size the batch's own."""
    nncf = _nncf()
    batches = [x.detach().to('cpu', torch.float32) for x in calibration]
    batches = [[_pad_to(x, multiple).numpy(), _whole(x.shape)] if len(ov_model.inputs) == 2
               else x.contiguous().numpy() for x in batches]
    kwargs = dict(ignored_scope=nncf.IgnoredScope(names=ops_under(ov_model, keep_fp32), validate=False)
                  ) if keep_fp32 else {}
    return nncf.quantize(ov_model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=min(subset_size, sum(len(b) for b in batches)), **kwargs)


def check_shapes(shapes: str, cache_size: int, specialise_after: int) -> None:
    """A ValueError naming a ``shapes`` not in ``SHAPES``, or a ``cache_size`` or ``specialise_after`` that is not
    an int of at least 1."""
    if shapes not in SHAPES:
        raise ValueError(f'shapes must be one of {SHAPES}, got {shapes!r}')
    for name, value in (('cache_size', cache_size), ('specialise_after', specialise_after)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f'{name} must be an int of at least 1, got {value!r}')


def _pad_to(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """The (B, C, H, W) tensor ``x`` zero-padded bottom/right to sides that are multiples of ``multiple``,
    contiguous."""
    h, w = x.shape[-2:]
    return torch.nn.functional.pad(x, (0, -w % multiple, 0, -h % multiple)).contiguous()


def _whole(shape: Sequence[int]):
    """The valid sizes of a batch of ``shape`` whose images fill it: a (B, 2) int64 array."""
    return torch.tensor([list(shape[-2:])] * shape[0], dtype=torch.int64).numpy()


class OpenVINOModule(EngineModule, nn.Module):
    """``ov_model`` (from ``convert``, its outputs' pytree spec ``out_spec``) compiled for the CPU at ``precision``
    (``compile_config``, with ``threads``; None: OpenVINO's choice), with the call contract of the module it was
    converted from: ``forward(x)`` takes an NCHW float tensor of ``in_chans`` channels (``check_input``) and
    returns CPU float32 tensors in the original output structure. ``shapes`` (a ValueError otherwise,
    ``check_shapes``):

    * ``'dynamic'``: one model compiled for every input shape;
    * ``'static'``: a model compiled per input shape at its first call, the ``cache_size`` most recently used
      kept (``compiled_shapes``);
    * ``'auto'``: the dynamic model, and for a shape met ``specialise_after`` times (counted for the
      ``COUNTED_SHAPES`` most recently seen) a model compiled for it, kept as ``'static'`` keeps them.

    Thread-safe: each compiled model keeps a pool of infer requests (one per concurrent call), and choosing and
    compiling models is serialised."""

    COUNTED_SHAPES = 1024
    engine = 'openvino'

    def __init__(self, ov_model, out_spec, in_chans: int, precision: str = 'fp32', shapes: str = 'auto',
                 cache_size: int = 8, threads: int | None = None, specialise_after: int = 64):
        super().__init__()
        check_shapes(shapes, cache_size, specialise_after)
        ov = _openvino()
        self.ov_model, self.out_spec, self.in_chans = ov_model, out_spec, in_chans
        self.precision, self.shapes, self.cache_size = precision, shapes, cache_size
        self.specialise_after = specialise_after
        self._core, self._config = ov.Core(), compile_config(precision, threads)
        self._compiled: collections.OrderedDict[tuple[int, ...], _Requests] = collections.OrderedDict()
        self._calls: collections.OrderedDict[tuple[int, ...], int] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._dynamic = _Requests(self._core.compile_model(ov_model, 'CPU', self._config)) \
            if shapes != 'static' else None
        self.eval()

    @property
    def compiled_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The input shapes that have a model compiled for them, least recently used first."""
        return tuple(self._compiled)

    def compiled_for(self, shape: tuple[int, ...]) -> '_Requests':
        """The compiled model (with its infer requests) that runs inputs of ``shape``: a shape-specialised one
        compiled now where the strategy says so."""
        with self._lock:
            return self._choose(shape)

    def _choose(self, shape: tuple[int, ...]) -> '_Requests':
        if self.shapes == 'dynamic':
            return self._dynamic
        if shape in self._compiled:
            self._compiled.move_to_end(shape)
            return self._compiled[shape]
        if self.shapes == 'auto':
            calls = self._calls.pop(shape, 0) + 1
            if calls < self.specialise_after:
                self._calls[shape] = calls
                if len(self._calls) > self.COUNTED_SHAPES:
                    self._calls.popitem(last=False)
                return self._dynamic
        model = self.ov_model.clone()
        model.reshape({port: dims for port, dims in zip(model.inputs, (list(shape), [shape[0], 2]), strict=False)})
        compiled = _Requests(self._core.compile_model(model, 'CPU', self._config))
        self._compiled[shape] = compiled
        while len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)
        return compiled

    def forward(self, x: torch.Tensor):
        from ...models.base import check_input
        check_input(x, self.in_chans)
        return self._run(x)

    def _run(self, x: torch.Tensor, sizes: torch.Tensor | None = None):
        array = x.detach().to('cpu', torch.float32).contiguous().numpy()
        inputs = [array] if sizes is None else [array, sizes.to('cpu', torch.int64).contiguous().numpy()]
        outs = [torch.from_numpy(out) for out in self.compiled_for(tuple(array.shape))(inputs)]
        return pytree.tree_unflatten(outs, self.out_spec)

    def extra_repr(self) -> str:
        return f'precision={self.precision!r}, shapes={self.shapes!r}' + (
            f', cache_size={self.cache_size}' if self.shapes != 'dynamic' else '') + (
            f', specialise_after={self.specialise_after}' if self.shapes == 'auto' else '')


class SizedOpenVINOModule(OpenVINOModule):
    """An ``OpenVINOModule`` converted with valid sizes (``convert(..., sizes_input=True)``): ``forward(x,
    valid_sizes=None)`` takes each image's valid (h, w) of a padded batch as the models do (``layers.valid``;
    default: every image fills the batch), for inputs whose sides are multiples of ``multiple`` (the model's
    largest stride; a ValueError otherwise). A ValueError where ``ov_model`` has not two inputs."""

    def __init__(self, ov_model, *args, multiple: int = 1, **kwargs):
        if len(ov_model.inputs) != 2:
            raise ValueError(f'a model converted with sizes_input has two inputs (images, valid sizes), this one has '
                             f'{len(ov_model.inputs)}')
        super().__init__(ov_model, *args, **kwargs)
        self.multiple = multiple

    def forward(self, x: torch.Tensor, valid_sizes=None):
        from ...layers.valid import check_valid_sizes
        from ...models.base import check_input
        check_input(x, self.in_chans)
        if x.shape[-2] % self.multiple or x.shape[-1] % self.multiple:   # the CPU plugin's shape inference fails
            raise ValueError(f'OpenVINO runs the model converted with valid sizes at sides that are multiples of '
                             f'{self.multiple}, got {tuple(x.shape[-2:])}: pad the batch (deploy.bucketed.Bucketed, '
                             "prepare(model, 'openvino', bucket=...)) or convert without sizes_input")
        sizes = torch.from_numpy(_whole(x.shape)) if valid_sizes is None else check_valid_sizes(valid_sizes, x)
        return self._run(x, sizes)


class _Requests:
    """A compiled model and a pool of its infer requests: a call takes an idle one (or makes one), runs, copies the
    outputs out and gives the request back, so concurrent calls never share one."""

    def __init__(self, compiled):
        self.compiled, self._idle = compiled, queue.SimpleQueue()

    def __call__(self, arrays: list) -> list:
        try:
            request = self._idle.get_nowait()
        except queue.Empty:
            request = self.compiled.create_infer_request()
        try:
            result = request.infer(arrays)
            return [result[port].copy() for port in self.compiled.outputs]
        finally:
            self._idle.put(request)


def check_conversion(ov_model, spec, model: nn.Module, in_chans: int, size: tuple[int, int] = (97, 131),
                     tolerance: float = 1e-3) -> float:
    """``deploy.check.check_against_torch`` of the converted model in float32 against ``model``; one converted
    with valid sizes at ``size`` raised to multiples of the model's largest stride."""
    if len(ov_model.inputs) == 1:
        return check_against_torch(OpenVINOModule(ov_model, spec, in_chans), model, in_chans, 'OpenVINO conversion',
                                   size, tolerance)
    from ..bucketed import largest_stride
    multiple = largest_stride(model)
    return check_against_torch(SizedOpenVINOModule(ov_model, spec, in_chans, multiple=multiple), model, in_chans,
                               'OpenVINO conversion', tuple(-(-n // multiple) * multiple for n in size), tolerance)


def _validate(precision: str, options) -> None:
    if 'example_size' in options:
        check_example_size(None, options['example_size'])
    check_shapes(options.get('shapes', 'auto'), options.get('cache_size', 8), options.get('specialise_after', 64))
    threads = options.get('threads')
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f'engine openvino: threads must be a positive int, got {threads!r}')


def _prepare(model: nn.Module, request, calibration, cache) -> OpenVINOModule:
    """The engine's transform: ``model`` (left as it is) as an ``OpenVINOModule``, converted (``convert``, at the
    option ``example_size``, default 224 x 224), checked (``check_conversion``), at int8 quantized on
    ``calibration`` (``quantize``, with ``request.keep_fp32``), compiled at the request's precision. Options:
    ``shapes``, ``cache_size``, ``specialise_after``, ``threads`` (``OpenVINOModule``); ``in_chans`` (default:
    the model's, else 3); ``sizes_input``: a ``SizedOpenVINOModule`` (``check_sized_conversion`` first), cached
    apart. ``cache``: the saved conversion and quantized model are read instead of made where they hold for this
    model (``deploy.artifacts``); a conversion saved without module names is redone where ``keep_fp32`` needs
    them."""
    options = request.options
    precision, keep_fp32 = request.precision, request.keep_fp32
    sizes_input = bool(options.get('sizes_input', False))
    in_chans = in_chans_of(model, options)
    multiple = 1   # what the sides of the converted model's inputs are multiples of
    if sizes_input:
        from ..bucketed import largest_stride
        check_sized_conversion(model, in_chans, 'converted with sizes_input')
        multiple = largest_stride(model)
    variant = 'valid_sizes' if sizes_input else ''
    result, conversion = cache.result('.xml', variant, ('.bin',)), cache.conversion('.xml', variant, ('.bin',))
    loaded = _load(result, model, in_chans, sizes_input)
    if loaded is not None:
        ov_model, spec = loaded
    else:
        saved = _load(conversion, model, in_chans, sizes_input) if precision == 'int8' else None
        if saved is not None and (not keep_fp32 or saved[0].has_rt_info(MODULES_KEY)):
            ov_model, spec = saved
        else:  # nothing saved, or saved without the module names that keep_fp32 selects by: convert
            size = check_example_size(model, options.get('example_size', (224, 224)))
            ov_model, spec = convert(model, torch.randn(2, in_chans, *size), sizes_input)
            check_conversion(ov_model, spec, model, in_chans)
            if precision == 'int8' and conversion is not None:
                _save(conversion, ov_model)
        if precision == 'int8':
            ov_model = quantize(ov_model, calibration, keep_fp32, multiple=multiple)
        if result is not None:
            _save(result, ov_model)
    settings = {k: options[k] for k in ('shapes', 'cache_size', 'threads', 'specialise_after') if k in options}
    module_cls = SizedOpenVINOModule if sizes_input else OpenVINOModule
    prepared = module_cls(ov_model, spec, in_chans, precision, **settings,
                          **(dict(multiple=multiple) if sizes_input else {}))
    prepared.strides = tuple(getattr(model, 'strides', ()) or ())   # its output maps' (run_images crops by them)
    return prepared


def _load(artifact, model: nn.Module, in_chans: int, sizes_input: bool = False):
    """The model saved as ``artifact`` (``_read``) where there is one and it holds for ``model`` with the
    valid-size input where ``sizes_input``, else None (with a warning saying why, where something was there)."""
    path = artifact.load() if artifact is not None else None
    if path is None:
        return None
    try:
        ov_model, spec = _read(path, model, in_chans)
    except RuntimeError as e:
        artifact.refuse(f'OpenVINO cannot read it ({e})')
        return None
    if len(ov_model.inputs) != 1 + sizes_input:
        artifact.refuse(f'it has {len(ov_model.inputs)} inputs, not {1 + sizes_input}')
        return None
    return ov_model, spec


def _save(artifact, ov_model) -> None:
    """Save ``ov_model`` as ``artifact`` (``openvino.save_model``, float32 weights as they are), first gathering
    every operation's ``MODULE_KEY`` into ``ov_model``'s own runtime info (``MODULES_KEY``), which the IR keeps."""
    ov = _openvino()
    modules = {op.get_friendly_name(): op.get_rt_info()[MODULE_KEY].astype(str) for op in ov_model.get_ops()
               if MODULE_KEY in op.get_rt_info()}
    if modules:
        ov_model.set_rt_info(json.dumps(modules, separators=(',', ':')), MODULES_KEY)
    artifact.save(lambda target: ov.save_model(ov_model, str(target), compress_to_fp16=False))


def _read(path, model: nn.Module, in_chans: int):
    """A saved conversion of ``model`` (with the module of every operation, as ``_save`` recorded them) and the
    pytree spec of ``model``'s outputs (from one small call)."""
    with torch.no_grad():
        _, spec = pytree.tree_flatten(model(torch.randn(1, in_chans, 32, 32)))
    ov_model = _openvino().Core().read_model(str(path))
    if ov_model.has_rt_info(MODULES_KEY):
        modules = json.loads(ov_model.get_rt_info(MODULES_KEY).astype(str))
        for op in ov_model.get_ops():
            module = modules.get(op.get_friendly_name())
            if module is not None:
                op.get_rt_info()[MODULE_KEY] = module
    return ov_model, spec


register(Engine(
    'openvino', 'model', {'fp32': 'everything',
                          'bf16': "what OpenVINO's bf16 inference precision keeps; float32 throughout on CPUs "
                                  'without native bf16 (with a warning)',
                          'int8': 'what NNCF leaves unquantized (transformer preset), layers in keep_fp32'},
    _prepare, 'OpenVINO for the CPU (deploy.engines.openvino): converted once through torch.export, any size after',
    requires=('openvino', 'nncf'), install=EXTRA, calibrated=('int8',),
    options=('shapes', 'cache_size', 'specialise_after', 'threads', 'example_size', 'in_chans', 'sizes_input'),
    validate=_validate, bucketing={'sizes_input': True},
    run_options=('shapes', 'cache_size', 'specialise_after', 'threads')))

__all__ = ['EXTRA', 'MODULE_KEY', 'MODULES_KEY', 'SHAPES', 'OpenVINOModule', 'SizedOpenVINOModule', 'available',
           'check_conversion', 'check_shapes', 'compile_config', 'convert', 'native_bf16', 'ops_under', 'quantize']
