"""The engine room's one door: every inference engine in ``ENGINES`` (an ``Engine``, registered by its file in
``deploy/engines/``), reached only through ``prepare``. An ``EngineRequest`` is checked against what its engine
declares once, where it is made.
"""
import copy
import hashlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .precision import PRECISIONS, check_precision

COVERS = ('backbone', 'model')


class EngineModule:
    """The mark of a module an engine made (mixed into it before ``nn.Module``): ``engine`` names the engine, so that
    ``prepare`` refuses to prepare what holds one."""
    engine: str = ''


@dataclass(frozen=True)
class Engine:
    """One inference engine. ``covers``: ``'backbone'`` (our backbone; the rest of a model stays in PyTorch
    float32) or ``'model'`` (any module mapping one image batch to tensors, ``deploy.openmmlab.TensorForward``);
    ``precisions``: each precision it runs, with what stays float32 there; ``summary``: one line for
    ``engine_table``. ``transform(module, request, calibration, cache)`` returns ``module`` on the engine
    (``module`` itself where the engine runs it as it is, else a new module; ``module`` is never changed):
    ``calibration``, a ``Calibration`` at the precisions in ``calibrated`` (else None); ``cache``, the request's
    ``deploy.artifacts.ArtifactCache``. ``options``: the names of the engine's own options, whose values ``validate``
    (``validate(precision, options)``) refuses where wrong; ``calibration_option``: the option that stands in for
    calibration (ranges recorded before). ``trains``: the precisions whose prepared module also trains.
    ``bucketing``: the options under which its prepared module takes ``valid_sizes`` (``prepare(..., bucket=)``), or
    None where it cannot. ``run_options``: the options that change only how a saved artifact runs (threads, shape
    strategies), not what is saved; every other option is part of what an artifact is made for
    (``deploy.artifacts``). ``requires``: packages it needs (``install`` says how to get them); their versions go
    into the record of every artifact it saves."""
    name: str
    covers: str
    precisions: Mapping[str, str]
    transform: Callable[..., nn.Module]
    summary: str
    requires: tuple[str, ...] = ()
    install: str = ''
    calibrated: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    validate: Callable[[str, Mapping[str, object]], None] | None = None
    calibration_option: str | None = None
    trains: tuple[str, ...] = ()
    bucketing: Mapping[str, object] | None = None
    run_options: tuple[str, ...] = ()

    def missing(self) -> tuple[str, ...]:
        """The packages it needs that are not installed."""
        return tuple(p for p in self.requires if importlib.util.find_spec(p) is None)


ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    """Add ``engine`` to ``ENGINES`` and return it; a ValueError for an unknown coverage or precision or a name
    taken."""
    if engine.name in ENGINES:
        raise ValueError(f'an engine named {engine.name!r} is registered already')
    if engine.covers not in COVERS:
        raise ValueError(f'engine {engine.name!r}: covers must be one of {COVERS}, got {engine.covers!r}')
    for precision in (*engine.precisions, *engine.calibrated, *engine.trains):
        check_precision(precision)
    if set(engine.run_options) - set(engine.options):
        raise ValueError(f'engine {engine.name!r}: run_options {sorted(set(engine.run_options) - set(engine.options))} '
                         'are not among its options')
    ENGINES[engine.name] = engine
    return engine


def _engine(name: str, precision: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f'unknown engine {name!r}; the engines are {sorted(ENGINES)}')
    spec = ENGINES[name]
    check_precision(precision)
    if precision not in spec.precisions:
        others = [n for n, e in ENGINES.items() if precision in e.precisions]
        raise ValueError(f'engine {name!r} runs {", ".join(spec.precisions)}, not {precision!r}; {precision} runs '
                         f'on: {", ".join(others)}')
    if spec.missing():
        raise ImportError(f'engine {name!r} needs {", ".join(spec.missing())}: {spec.install}')
    return spec


def module_names(names: 'str | Iterable[str]') -> tuple[str, ...]:
    """``keep_fp32`` as a tuple of module names, in order, once each (a plain string is one name); a ValueError
    where one is not a string."""
    names = (names,) if isinstance(names, str) else tuple(names)
    other = [n for n in names if not isinstance(n, str)]
    if other:
        raise ValueError(f'keep_fp32 takes module names (strings, as in model.named_modules()), got {other!r}')
    return tuple(dict.fromkeys(names))


def under(name: str, modules: Iterable[str]) -> bool:
    """True where the module ``name`` is one of ``modules`` or inside one ('blocks.1' holds 'blocks.1.attn', not
    'blocks.10'; '' holds every module): what ``keep_fp32`` keeps, on every engine."""
    return any(m == '' or name == m or name.startswith(m + '.') for m in modules)


def check_modules(module: nn.Module, names: Sequence[str], what: str = 'keep_fp32') -> None:
    """A ValueError naming each of ``names`` that is not a module of ``module`` ('' being ``module`` itself)."""
    known = dict(module.named_modules())
    unknown = [n for n in names if n not in known]
    if unknown:
        examples = [n for n, m in known.items() if n and '.' not in n][:6]
        raise ValueError(f'{what}: {", ".join(map(repr, unknown))} is not a module of {type(module).__name__} '
                         f'(module names as in named_modules(), such as {", ".join(map(repr, examples))})')


def in_chans_of(module: nn.Module, options: Mapping[str, object]) -> int:
    """The input channels an engine runs ``module`` with: the option ``in_chans``, else the ``in_chans`` of
    ``module`` or of its first submodule that has one (an OpenMMLab model's backbone), else 3."""
    if options.get('in_chans'):
        return int(options['in_chans'])
    return next((m.in_chans for m in module.modules() if isinstance(getattr(m, 'in_chans', None), int)), 3)


@dataclass(frozen=True)
class EngineRequest:
    """One request for an engine, checked here, once, against what the engine declares (its precisions, packages,
    options, and which precisions it calibrates), and carried unchanged from where a tool, a config or a caller asks
    to ``prepare``. ``engine`` at ``precision``. At a calibrated precision: ``keep_fp32``, names of modules of the
    requested model whose layers stay float32, each with everything under it (``under``; one name may be given as a
    plain string; '' is the whole model); ``calibration_source``, where the input batches come from
    when the request is for a config's model ('val', its test set, or a folder of images; ``calibration_images`` of
    them, read by ``adapters.engines.engine_model``), None where the caller gives batches to ``prepare``.
    ``cache``: a path prefix where the engine keeps what it derives for this request; ``float_cache``: the same
    for the float32 conversion that every precision of the model starts from (``deploy.artifacts``); None: nothing
    kept. ``options``: the engine's own. A ValueError where the request does not fit the engine, an ImportError
    where a package it needs is missing."""
    engine: str
    precision: str = 'fp32'
    calibration_source: str | None = None
    calibration_images: int = 32
    keep_fp32: tuple[str, ...] = ()
    cache: str | None = None
    float_cache: str | None = None
    options: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        spec = _engine(self.engine, self.precision)
        object.__setattr__(self, 'keep_fp32', module_names(self.keep_fp32))
        object.__setattr__(self, 'options', dict(self.options))
        for name in ('cache', 'float_cache'):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(getattr(self, name)))
        if self.precision not in spec.calibrated and (self.calibration_source is not None or self.keep_fp32):
            raise ValueError(f'calibration and keep_fp32 configure the calibrated precisions of engine '
                             f'{self.engine!r} ({", ".join(spec.calibrated) or "none"}); '
                             f'precision={self.precision!r} does not use them')
        if self.precision in spec.calibrated and self.cache is not None and self.cache == self.float_cache:
            raise ValueError(f'cache and float_cache both name {self.cache!r}: at {self.precision} the calibrated '
                             'model and the float32 conversion it starts from are two artifacts, give two prefixes')
        if self.calibration_images < 1:
            raise ValueError(f'calibration_images must be at least 1, got {self.calibration_images}')
        unknown = sorted(set(self.options) - set(spec.options))
        if unknown:
            fields = {'calibration', 'keep_fp32', 'precision', 'cache', 'float_cache'} & set(unknown)
            raise ValueError(f'engine {self.engine!r}: ' + (f'{sorted(fields)} are fields of the request, not options'
                             if fields else f'unknown option(s) {unknown}; its options are '
                             f'{", ".join(spec.options) or "none"}'))
        if spec.validate is not None:
            spec.validate(self.precision, self.options)

    @classmethod
    def of(cls, engine: 'str | EngineRequest', precision: str = 'fp32', keep_fp32: Sequence[str] = (),
           **options) -> 'EngineRequest':
        """``engine`` itself where it is a request (and nothing else is given), else the request of those arguments
        (``cache``, ``float_cache``, ``calibration_source`` and ``calibration_images`` taken out of ``options`` as
        the request's fields)."""
        if isinstance(engine, EngineRequest):
            if precision != 'fp32' or keep_fp32 or options:
                raise ValueError('an EngineRequest carries its precision, keep_fp32, caches and options: pass the '
                                 'request alone')
            return engine
        fields = {k: options.pop(k) for k in ('cache', 'float_cache', 'calibration_source', 'calibration_images')
                  if k in options}
        return cls(engine, precision, keep_fp32=keep_fp32, options=options, **fields)

    @property
    def spec(self) -> Engine:
        return ENGINES[self.engine]

    def filled(self, **values) -> 'EngineRequest':
        """This request with what a route fills in for the model it prepares (``keep_fp32`` renamed to that
        model's module names, the caches it names by content, the options under which the engine runs buckets),
        not checked again."""
        unknown = set(values) - {'keep_fp32', 'cache', 'float_cache', 'options'}
        if unknown:
            raise ValueError(f'a route fills in keep_fp32, the caches and options only, not {sorted(unknown)}')
        out = copy.copy(self)
        for name, value in values.items():
            object.__setattr__(out, name, module_names(value) if name == 'keep_fp32' else value)
        return out


def prepared_as(module: nn.Module) -> str | None:
    """What engine already prepared ``module`` (or a submodule of it), in words, or None for a plain module."""
    for name, sub in module.named_modules():
        if isinstance(sub, EngineModule):
            return f"the {sub.engine} engine's {type(sub).__name__}" + (f' at {name!r}' if name else '')
    return None


class Calibration:
    """The input batches an engine calibrates on, checked once and held in memory (as the engines read them): every
    batch a finite floating-point (B, ``in_chans``, H, W) tensor (``models.base.check_input``), at least one; a
    ValueError or TypeError naming the batch and what is wrong otherwise (uint8 pixels, NaN, another number of
    channels). ``sha256``: of their shapes and float32 values, what a calibrated artifact is made for; ``describe``:
    what its record keeps of them."""

    def __init__(self, batches: Iterable[torch.Tensor], source: str | None = None, in_chans: int = 3):
        from ..models.base import check_input
        from ..utils import tensor_bytes
        if isinstance(batches, torch.Tensor):
            raise TypeError(f'int8 calibration is an iterable of input batches, got one tensor of shape '
                            f'{tuple(batches.shape)}: pass [batch]')
        held, digest = [], hashlib.sha256()
        for i, batch in enumerate(batches):
            try:
                check_input(batch, in_chans, check_finite=True)
            except (TypeError, ValueError) as e:
                raise type(e)(f'int8 calibration batch {i}: {e}') from None
            batch = batch.detach()
            digest.update(f'{tuple(batch.shape)};'.encode())
            digest.update(tensor_bytes(batch.to(torch.float32)))
            held.append(batch)
        if not held:
            raise ValueError('int8 calibration is empty: pass at least one input batch (NCHW float tensors, '
                             'representative of what will be run)')
        self.batches, self.source, self.sha256 = held, source, digest.hexdigest()

    def __iter__(self):
        return iter(self.batches)

    def describe(self) -> dict:
        """Where the batches came from (the request's source, where given), how many batches and images they were
        and the sha256 of their values."""
        return dict(source=self.source, batches=len(self.batches), images=sum(len(b) for b in self.batches),
                    sha256=self.sha256)


def prepare(module: nn.Module, engine: 'str | EngineRequest', precision: str = 'fp32', *,
            calibration: Iterable[torch.Tensor] | None = None, keep_fp32: Sequence[str] = (),
            bucket: int | None = None, **options) -> nn.Module:
    """``module`` (evaluation mode, float32; what the engine covers) on ``engine`` at ``precision``, or as an
    ``EngineRequest`` asks (given alone): the only way onto an engine. ``calibration``: an iterable of input
    batches, required and non-empty at a precision the engine calibrates (unless its ``calibration_option`` gives
    recorded ranges) and refused elsewhere; ``keep_fp32``, ``cache``, ``float_cache`` and the engine's own
    ``options``: as ``EngineRequest`` takes them. ``bucket`` (a step in pixels, a multiple of the model's largest
    stride): the prepared module wrapped in ``deploy.bucketed.Bucketed``, inputs padded to multiples of it and run
    with their valid sizes. ``module`` itself is never changed. Refused before anything is prepared: an engine that
    runs no valid sizes with ``bucket`` (ValueError), a module whose forward takes none (TypeError), a module in
    training mode or holding a prepared one (ValueError), a ``keep_fp32`` name that is no module of ``module``
    (``check_modules``), calibration batches ``Calibration`` refuses, a request ``EngineRequest`` refuses."""
    from .artifacts import ArtifactCache
    request = EngineRequest.of(engine, precision, keep_fp32, **options)
    spec, name, precision = request.spec, request.engine, request.precision
    if bucket is not None:
        from .batched import takes_valid_sizes
        from .bucketed import Bucketed, check_step
        if spec.bucketing is None:
            raise ValueError(f'engine {name!r} does not run valid sizes, so it cannot pad inputs to buckets (bucket='
                             f'{bucket}); engines that can: '
                             f'{", ".join(n for n, e in ENGINES.items() if e.bucketing is not None)}')
        check_step(bucket, module)
        if not takes_valid_sizes(module):
            raise TypeError(f'bucket={bucket}: bucketed shapes pad inputs, so the module must take valid_sizes (our '
                            f'models do); {type(module).__name__} does not')
        request = request.filled(options={**request.options, **spec.bucketing})
    if precision not in spec.calibrated:
        if calibration is not None:
            raise ValueError(f'calibration configures {", ".join(spec.calibrated) or "no precision"} on engine '
                             f'{name!r}; precision={precision!r} does not use it')
    elif request.options.get(spec.calibration_option) is not None:
        calibration = None   # the ranges are given: nothing is calibrated
    else:
        if calibration is None:
            raise ValueError(f'engine {name!r}: {precision} quantizes activations at calibrated ranges: pass '
                             'calibration=<an iterable of input batches> (NCHW float tensors, representative of what '
                             'will be run)')
        calibration = Calibration(calibration, request.calibration_source, in_chans_of(module, request.options))
    if module.training:
        raise ValueError(f'engine {name!r} prepares a model in evaluation mode: call model.eval() first')
    done = prepared_as(module)
    if done is not None:
        raise ValueError(f'engine {name!r}: this module was prepared for an engine already (it holds {done}); '
                         'prepare the plain model instead (prepare leaves its argument as it was)')
    check_modules(module, request.keep_fp32)
    prepared = spec.transform(module, request, calibration, ArtifactCache(request, module, calibration))
    return prepared if bucket is None else Bucketed(prepared, bucket)


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


__all__ = ['COVERS', 'ENGINES', 'Calibration', 'Engine', 'EngineModule', 'EngineRequest', 'check_modules',
           'engine_table', 'in_chans_of', 'module_names', 'prepare', 'prepared_as', 'register', 'under']
