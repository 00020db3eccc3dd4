"""The engine room: every inference engine behind one registry, ``ENGINES``, and one way in, ``prepare``.

An ``Engine`` declares its name, what it covers (``'backbone'``: our backbone, the rest of a model staying in
PyTorch float32; ``'model'``: any module that maps one image batch to tensors: a backbone, a classifier, or an
OpenMMLab model's backbone + neck + head in tensor mode, ``deploy.openmmlab.TensorForward``), the precisions it
runs with what stays float32 in each, the packages it needs, and how it prepares a built model. The tools, the
mmengine hook and the benchmarks all reach an engine through ``prepare``; ``engine_table`` renders the
registry for ``--help`` and the docs. ``prepare(..., bucket=step)`` runs the prepared module at bucketed shapes
(``deploy.bucketed``) on the engines that take valid sizes. A new engine is one module with its transform plus
one ``register`` call at the end of this file.
"""
import importlib.util
import json
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .precision import PRECISIONS, check_precision

COVERS = ('backbone', 'model')


@dataclass(frozen=True)
class Engine:
    """One inference engine (see the module docstring). ``transform(module, precision, calibration, keep_fp32,
    cache=None, conversion_cache=None, **options)`` returns the module on the engine (the module itself where
    the engine runs it as it is); ``calibration`` (input batches, iterated only where the engine calibrates) and
    ``keep_fp32`` (module name prefixes left in float32) are given for int8 only. ``cache``: a file, named by
    everything the prepared result depends on and ending in ``cache_suffix``, where the engine may keep what it
    derives and read it back; ``conversion_cache``: the same for a float32 conversion that another precision of
    the same model may reuse. ``options``: the engine's own (threads, shapes, input ranges). ``requires``: the
    packages it needs, whose installed versions also key its caches (``adapters.engines.cache_versions``).
    ``bucketing``: the options under which its prepared module takes ``valid_sizes`` (so that ``prepare(...,
    bucket=step)`` can pad inputs to buckets, ``deploy.bucketed``), or None where it cannot."""
    name: str
    covers: str
    precisions: Mapping[str, str]
    requires: tuple[str, ...]
    install: str
    transform: Callable[..., nn.Module]
    summary: str
    trains: tuple[str, ...] = ()   # the precisions whose prepared module also trains (forward and backward)
    bucketing: Mapping[str, object] | None = None
    cache_suffix: str = ''

    def missing(self) -> tuple[str, ...]:
        """The packages it needs that are not installed."""
        return tuple(p for p in self.requires if importlib.util.find_spec(p) is None)


ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    """Add ``engine`` to ``ENGINES``, refusing an unknown coverage or precision and a name taken."""
    if engine.name in ENGINES:
        raise ValueError(f'an engine named {engine.name!r} is registered already')
    if engine.covers not in COVERS:
        raise ValueError(f'engine {engine.name!r}: covers must be one of {COVERS}, got {engine.covers!r}')
    for precision in engine.precisions:
        check_precision(precision)
    ENGINES[engine.name] = engine
    return engine


def engine(name: str) -> Engine:
    """The registered engine ``name``, or an error listing the registered ones."""
    if name not in ENGINES:
        raise ValueError(f'unknown engine {name!r}; the engines are {sorted(ENGINES)}')
    return ENGINES[name]


def check_engine(name: str, precision: str) -> Engine:
    """The engine ``name`` where it runs ``precision`` and its packages are installed, else an error naming
    the engines that run that precision (or the package to install)."""
    spec = engine(name)
    check_precision(precision)
    if precision not in spec.precisions:
        others = [n for n, e in ENGINES.items() if precision in e.precisions]
        raise ValueError(f'engine {name!r} runs {", ".join(spec.precisions)}, not {precision!r}; {precision} runs '
                         f'on: {", ".join(others)}')
    if spec.missing():
        raise ImportError(f'engine {name!r} needs {", ".join(spec.missing())}: {spec.install}')
    return spec


@dataclass(frozen=True)
class EngineRequest:
    """One request for an engine, checked once when it is made (``check_engine``; int8's settings refused at
    other precisions) and carried unchanged from where a tool or a config asks (``adapters.engines``, the test
    loop's ``InferenceEngineHook``) to ``prepare``. ``engine`` at ``precision``; ``calibration``: where int8's
    input batches come from when the request is for a config's model ('val', its test set, or a folder of images;
    ``calibration_images`` of them; ``adapters.engines.engine_model`` reads them) and None otherwise (a module's
    batches are data, given to ``prepare`` beside the request); ``keep_fp32``: names of modules of the requested
    model (prefixes) whose layers stay float32 at int8; ``cache``: a path prefix where the engine keeps what it
    derives (its ``cache_suffix`` appended), or None: nothing kept, except that ``engine_model`` names one by
    content for a checkpoint file; ``conversion_cache``: the same for the float32 conversion that other precisions
    of the model share; ``options``: the engine's own."""
    engine: str
    precision: str = 'fp32'
    calibration: str | None = None
    calibration_images: int = 32
    keep_fp32: tuple[str, ...] = ()
    cache: str | None = None
    options: Mapping[str, object] = field(default_factory=dict)
    conversion_cache: str | None = None

    def __post_init__(self):
        check_engine(self.engine, self.precision)
        object.__setattr__(self, 'keep_fp32', tuple(self.keep_fp32))
        object.__setattr__(self, 'options', dict(self.options))
        if self.precision != 'int8' and (self.calibration is not None or self.keep_fp32):
            raise ValueError(f'calibration and keep_fp32 configure int8; precision={self.precision!r} does not use '
                             'them')
        if self.calibration_images < 1:
            raise ValueError(f'calibration_images must be at least 1, got {self.calibration_images}')
        reserved = sorted({'cache', 'conversion_cache', 'calibration', 'keep_fp32', 'precision'} & set(self.options))
        if reserved:
            raise ValueError(f'engine options {reserved} are fields of the request: pass them as such')

    @classmethod
    def of(cls, engine: 'str | EngineRequest', precision: str = 'fp32', keep_fp32: Sequence[str] = (),
           calibration: str | None = None, calibration_images: int = 32, **options) -> 'EngineRequest':
        """``engine`` itself where it is a request (and nothing else is given), else the request of those
        arguments (``options``: the engine's own, with ``cache`` and ``conversion_cache`` taken out as the
        request's fields; paths are kept as strings)."""
        if isinstance(engine, EngineRequest):
            if (precision != 'fp32' or tuple(keep_fp32) or calibration is not None or calibration_images != 32
                    or options):
                raise ValueError('an EngineRequest carries its precision, keep_fp32, calibration, cache and options: '
                                 'pass the request alone')
            return engine
        cache, conversion = options.pop('cache', None), options.pop('conversion_cache', None)
        return cls(engine, precision, calibration, calibration_images, tuple(keep_fp32),
                   None if cache is None else str(cache), options, None if conversion is None else str(conversion))

    def to_config(self) -> dict:
        """The request as plain values, for a config's hook (``InferenceEngineHook(**request.to_config())``)."""
        return dict(engine=self.engine, precision=self.precision, calibration=self.calibration,
                    calibration_images=self.calibration_images, keep_fp32=list(self.keep_fp32), cache=self.cache,
                    options=dict(self.options), conversion_cache=self.conversion_cache)

    @property
    def spec(self) -> Engine:
        return ENGINES[self.engine]


def prepared_as(module: nn.Module) -> str | None:
    """What engine already prepared ``module`` (or a submodule of it), in words, or None for a plain module: the
    fused engine's modules, an OpenVINO or onnxruntime module, an autocast wrapper."""
    from .autocast import AutocastModule
    from .fused import FusedBlock, FusedLinear
    kinds = {FusedBlock: "the fused engine's FusedBlock", FusedLinear: "the fused engine's FusedLinear",
             AutocastModule: "the torch engine's AutocastModule (bf16)"}
    for name, sub in module.named_modules():
        where = f' at {name!r}' if name else ''
        for cls, what in kinds.items():
            if isinstance(sub, cls):
                return f'{what}{where}'
        if type(sub).__name__ in ('OpenVINOModule', 'OnnxRuntimeModule'):
            return f'an {type(sub).__name__}{where} (the {type(sub).__name__[:-6].lower()} engine)'
    return None


class _Calibration:
    """``calibration`` iterated as given, refusing (at its first iteration) one that yields no batch."""

    def __init__(self, batches: Iterable[torch.Tensor]):
        self.batches = batches

    def __iter__(self):
        count = 0
        for batch in self.batches:
            count += 1
            yield batch
        if not count:
            raise ValueError('int8 calibration gave no input batch: pass a non-empty iterable of input batches '
                             '(NCHW float tensors, representative of what will be run)')


def prepare(module: nn.Module, engine: 'str | EngineRequest', precision: str = 'fp32',
            calibration: Iterable[torch.Tensor] | None = None, keep_fp32: Sequence[str] = (),
            bucket: int | None = None, **options) -> nn.Module:
    """``module`` (evaluation mode, float32; what the engine covers) on ``engine`` at ``precision`` (or as an
    ``EngineRequest`` asks, given alone): ``calibration`` (an iterable of input batches, required and non-empty
    for int8) and ``keep_fp32`` configure int8 and are refused elsewhere; ``cache`` (a path prefix) and the other
    ``options`` go to the engine's transform. ``bucket`` (a step in pixels, a multiple of the model's largest
    stride): the prepared module wrapped in ``deploy.bucketed.Bucketed``, inputs padded to multiples of it and
    run with their valid sizes; an engine that runs no valid sizes, or a module whose forward takes none, is
    refused by name before the engine prepares anything. ``module`` itself is never changed (an engine that
    transforms modules works on a copy; one that runs the module as it is returns it), and a module an engine has
    prepared already is refused, naming what it holds: prepare the plain model."""
    request = EngineRequest.of(engine, precision, keep_fp32, **options)
    return prepare_request(module, request, calibration, bucket=bucket)


def prepare_request(module: nn.Module, request: EngineRequest, calibration: Iterable[torch.Tensor] | None = None,
                    keep_fp32: Sequence[str] | None = None, caches: tuple[str | None, str | None] | None = None,
                    bucket: int | None = None) -> nn.Module:
    """``prepare`` for a request already checked, as the OpenMMLab route carries it (``deploy.openmmlab.on_engine``):
    ``keep_fp32``, the request's names as they are in ``module`` where it is part of the requested model (default:
    the request's own); ``caches``, the (result, float32 conversion) path prefixes named for this model (default:
    the request's ``cache`` and ``conversion_cache``). The engine's ``cache_suffix`` is appended here, the one place
    a cache file is named."""
    spec = request.spec
    name, precision = request.engine, request.precision
    options = dict(request.options)
    if bucket is not None:
        from .bucketed import check_step
        if spec.bucketing is None:
            raise ValueError(f'engine {name!r} does not run valid sizes, so it cannot pad inputs to buckets (bucket='
                             f'{bucket}); engines that can: '
                             f'{", ".join(n for n, e in ENGINES.items() if e.bucketing is not None)}')
        check_step(bucket, module)
        from .batched import takes_valid_sizes
        if not takes_valid_sizes(module):
            raise TypeError(f'bucket={bucket}: bucketed shapes pad inputs, so the module must take valid_sizes (our '
                            f'models do); {type(module).__name__} does not')
        options.update(spec.bucketing)
    if precision != 'int8' and calibration is not None:
        raise ValueError(f'calibration configures int8; precision={precision!r} does not use it')
    if precision == 'int8' and not options.get('input_ranges'):
        if calibration is None:
            raise ValueError(f'engine {name!r}: int8 quantizes activations at calibrated ranges: pass '
                             'calibration=<an iterable of input batches> (NCHW float tensors, representative of what '
                             'will be run)')
        if isinstance(calibration, Sized) and len(calibration) == 0:
            raise ValueError('int8 calibration is empty: pass at least one input batch (NCHW float tensors, '
                             'representative of what will be run)')
        calibration = _Calibration(calibration)
    if module.training:
        raise ValueError(f'engine {name!r} prepares a model in evaluation mode: call model.eval() first')
    done = prepared_as(module)
    if done is not None:
        raise ValueError(f'engine {name!r}: this module was prepared for an engine already (it holds {done}); '
                         'prepare the plain model instead (prepare leaves its argument as it was)')
    cache, conversion = caches if caches is not None else (request.cache, request.conversion_cache)
    prepared = spec.transform(module, precision, calibration,
                              tuple(request.keep_fp32 if keep_fp32 is None else keep_fp32),
                              cache=f'{cache}{spec.cache_suffix}' if cache else None,
                              conversion_cache=f'{conversion}{spec.cache_suffix}' if conversion else None, **options)
    if bucket is None:
        return prepared
    from .bucketed import Bucketed
    return Bucketed(prepared, bucket)


def engine_table() -> str:
    """The registry as Markdown: a table of engine, covers, precision and what stays float32 there, needs; then
    each engine's summary."""
    lines = ['| engine | covers | precision | stays float32 | needs |', '|---|---|---|---|---|']
    for spec in ENGINES.values():
        for precision in (p for p in PRECISIONS if p in spec.precisions):
            lines.append(f'| {spec.name} | {spec.covers} | {precision} | {spec.precisions[precision]} | '
                         f'{", ".join(spec.requires) or "torch"} |')
    lines.append('')
    lines += [f'- {spec.name}: {spec.summary}' for spec in ENGINES.values()]
    return '\n'.join(lines)


def _torch(module, precision, calibration, keep_fp32, cache=None, conversion_cache=None):
    from .autocast import to_autocast
    if precision == 'fp32':
        return module
    device = next((p.device.type for p in module.parameters()), 'cpu')
    return to_autocast(module, precision, device)


def _fused(module, precision, calibration, keep_fp32, cache=None, conversion_cache=None, input_ranges=None):
    from .optimize import calibrated_ranges, optimize
    if precision == 'int8' and input_ranges is None:
        input_ranges = calibrated_ranges(module, calibration, keep_fp32, cache)
    elif isinstance(input_ranges, (str, Path)):
        input_ranges = json.loads(Path(input_ranges).read_text())['input_ranges']
    return optimize(module, precision=precision, keep_fp32=keep_fp32,
                    input_ranges=input_ranges if precision == 'int8' else None, inplace=False)


def _openvino(module, precision, calibration, keep_fp32, cache=None, conversion_cache=None, **options):
    from .openvino import to_openvino
    if precision != 'int8':  # fp32 and bf16 compile the float32 conversion itself
        cache = conversion_cache or cache
    return to_openvino(module, precision, calibration, keep_fp32, cache=cache, float_cache=conversion_cache,
                       **options)


def _onnxruntime(module, precision, calibration, keep_fp32, cache=None, conversion_cache=None, **options):
    from .onnxruntime import to_onnxruntime
    if precision != 'int8':  # float32 runs the export itself
        cache = conversion_cache or cache
    return to_onnxruntime(module, precision, calibration, keep_fp32, cache=cache, float_cache=conversion_cache,
                          **options)


register(Engine(
    'torch', 'model', {'fp32': 'everything',
                       'bf16': "autocast's float32 operations (norms, softmax, reductions); outputs returned in "
                               'float32'},
    (), '', _torch, 'PyTorch eager; bf16 under torch.autocast (native bf16 CPUs; elsewhere float32, with a warning)',
    trains=('fp32', 'bf16'), bucketing={}))
register(Engine(
    'fused', 'backbone', {'fp32': 'everything (same outputs to float32 rounding)',
                          'int8': 'all but the linear layers (norms, attention products and softmax, convolutions), '
                                  'linear layers in keep_fp32; the rest of the model'},
    (), '', _fused, "this package's fused CPU kernels for our transformer blocks (deploy.optimize); int8: static, "
                    'activations at ranges calibrated on input batches', trains=('fp32',), bucketing={},
    cache_suffix='.ranges.json'))
register(Engine(
    'openvino', 'model', {'fp32': 'everything',
                          'bf16': "what OpenVINO's bf16 inference precision keeps; float32 throughout on CPUs "
                                  'without native bf16 (with a warning)',
                          'int8': 'what NNCF leaves unquantized (transformer preset), layers in keep_fp32'},
    ('openvino', 'nncf'), "pip install 'cpvt_backbones[openvino]'", _openvino,
    'OpenVINO for the CPU (deploy.openvino): converted once through torch.export, any size after',
    bucketing={'sizes_input': True}, cache_suffix='.xml'))
register(Engine(
    'onnxruntime', 'model', {'fp32': 'everything',
                             'int8': 'all but the linear layers (attention products, norms, convolutions), linear '
                                     'layers in keep_fp32'},
    ('onnxruntime', 'onnxscript'), 'pip install onnxruntime onnxscript', _onnxruntime,
    'onnxruntime (CPU provider) on the ONNX export with dynamic batch, height and width (deploy.onnxruntime); '
    "int8: onnxruntime's static quantization, activations at ranges calibrated on input batches",
    cache_suffix='.onnx'))


__all__ = ['COVERS', 'ENGINES', 'Engine', 'EngineRequest', 'check_engine', 'engine', 'engine_table', 'prepare',
           'prepare_request', 'prepared_as', 'register']
