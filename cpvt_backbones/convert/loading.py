"""Strict loading of any known layout into a model, with errors that list what does not fit."""
import contextlib
import inspect
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from .hub import WeightsUnavailableError
from .io import WeightFileError, load_weights_file
from .layouts import UnknownLayoutError, to_native


class LoadReport(NamedTuple):
    """What does not fit: keys the model has and the checkpoint lacks, keys the model lacks, shape mismatches
    (key, checkpoint shape, model shape) and values of a kind the model's tensor cannot take without changing
    their numbers (key, checkpoint dtype, model dtype; ``_castable``)."""
    missing: list[str]
    unexpected: list[str]
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    wrong_dtype: tuple[tuple[str, torch.dtype, torch.dtype], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched or self.wrong_dtype)

    def describe(self, limit: int | None = 20) -> str:
        """One line: up to ``limit`` entries of each kind (``None``: all of them), then how many more."""
        def show(items) -> str:
            items = [str(i) for i in items]
            more = 0 if limit is None else max(len(items) - limit, 0)
            return ', '.join(items[:len(items) - more]) + (f', ... ({more} more)' if more else '')
        parts = []
        if self.missing:
            parts.append(f'missing keys ({len(self.missing)}): {show(self.missing)}')
        if self.unexpected:
            parts.append(f'unexpected keys ({len(self.unexpected)}): {show(self.unexpected)}')
        if self.mismatched:
            parts.append(f'shape mismatches ({len(self.mismatched)}): '
                         + show(f'{k} checkpoint {a} vs model {b}' for k, a, b in self.mismatched))
        if self.wrong_dtype:
            parts.append(f'values the model cannot take ({len(self.wrong_dtype)}): '
                         + show(f'{k} is {a} in the checkpoint, {b} in the model' for k, a, b in self.wrong_dtype))
        return '; '.join(parts)


class CheckpointMismatchError(ValueError):
    """The checkpoint does not fit the model; nothing was loaded. ``family``: what ``family_mismatch`` says when the
    checkpoint is of another model family than the model, put first, with ``limit`` keys of each kind after it."""

    def __init__(self, report: LoadReport, source: str = 'checkpoint', limit: int | None = 20,
                 family: str | None = None):
        self.report = report
        if family is None:
            super().__init__(f'{source} does not fit the model (nothing was loaded): {report.describe(limit)}')
        else:
            super().__init__(f'{source} does not fit the model: {family}. Nothing was loaded; what does not fit: '
                             f'{report.describe(limit)}')


# The package's model families, told apart by their block keys in the native layout (under any prefix, as a
# whole detector's ``backbone.``): pyramid blocks ``blocks.{stage}.{block}.`` with windowed attention
# (``attn.qkv``) are Twins-SVT's, with a convolutional feed-forward (``mlp.dwconv``) PVTv2's, with neither
# Twins-PCPVT's; columnar blocks ``blocks.{block}.`` CPVT's.
FAMILIES = {'svt': ('Twins-SVT', 'TwinsSVT'), 'pvt_v2': ('PVTv2', 'PVTv2'), 'pcpvt': ('Twins-PCPVT', 'PyramidCPVT'),
            'cpvt': ('CPVT', 'CPVT')}
_CONV_FEED_FORWARD = re.compile(r'(?:^|\.)blocks\.\d+\.\d+\.mlp\.dwconv\.weight$')
_WINDOWED = re.compile(r'(?:^|\.)blocks\.\d+\.\d+\.attn\.qkv\.weight$')
_PYRAMID_BLOCK = re.compile(r'(?:^|\.)blocks\.(\d+)\.(\d+)\.')
_COLUMNAR_BLOCK = re.compile(r'(?:^|\.)blocks\.(\d+)\.(?!\d)')
_PATCH_EMBED = re.compile(r'(?:^|\.)patch_embeds?\.(?:(\d+)\.)?proj\.weight$')
# Shown of each kind of key that does not fit when the family says what is wrong.
FAMILY_KEYS_SHOWN = 3


def checkpoint_family(state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """Which of ``FAMILIES`` a native-layout state dict (a model's or a checkpoint's) is: 'svt', 'pvt_v2', 'pcpvt'
    or 'cpvt'; None when it has no block of any."""
    keys = list(state_dict)
    if any(_WINDOWED.search(k) for k in keys):
        return 'svt'
    if any(_CONV_FEED_FORWARD.search(k) for k in keys):
        return 'pvt_v2'
    if any(_PYRAMID_BLOCK.search(k) for k in keys):
        return 'pcpvt'
    if any(_COLUMNAR_BLOCK.search(k) for k in keys):
        return 'cpvt'
    return None


def _structure(state_dict: Mapping[str, torch.Tensor], family: str) -> dict:
    """The widths (``embed_dims``, from the patch embeddings) and block counts (``depths``) of a pyramid state
    dict, or ``embed_dim``, ``depth`` and ``class_token`` of a columnar one."""
    widths, blocks = {}, {}
    for key, value in state_dict.items():
        if (match := _PATCH_EMBED.search(key)) and isinstance(value, torch.Tensor) and value.dim():
            widths[int(match.group(1) or 0)] = value.shape[0]
        if family == 'cpvt':
            if match := _COLUMNAR_BLOCK.search(key):
                blocks.setdefault(0, set()).add(int(match.group(1)))
        elif match := _PYRAMID_BLOCK.search(key):
            blocks.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    if family == 'cpvt':
        return dict(embed_dim=widths.get(0), depth=len(blocks.get(0, ())),
                    class_token=any(k.rsplit('.', 1)[-1] == 'cls_token' for k in state_dict))
    return dict(embed_dims=tuple(widths[i] for i in sorted(widths)),
                depths=tuple(len(blocks[i]) for i in sorted(blocks)))


def _named_models(family: str, structure: dict) -> list[str]:
    """The named models (``models.MODEL_SPECS``) of ``family`` whose settings have ``structure``."""
    from ..models.factory import MODEL_SPECS  # imported here: the models import this module
    names = []
    for name, spec in MODEL_SPECS.items():
        settings = {p.name: p.default for p in inspect.signature(spec.cls.__init__).parameters.values()}
        settings.update(spec.settings)
        spec_family = next(key for key, (_, cls_name) in FAMILIES.items() if cls_name == spec.cls.__name__)
        if spec_family == family and all(tuple(settings[k]) == v if isinstance(v, tuple) else settings[k] == v
                                         for k, v in structure.items()):
            names.append(name)
    return names


def family_mismatch(model_state: Mapping[str, torch.Tensor], checkpoint: Mapping[str, torch.Tensor]
                    ) -> str | None:
    """Where the native-layout ``checkpoint`` is of another family (``checkpoint_family``) than the model whose
    state dict is ``model_state``: which family it is, its widths and depths, and the named models it fits (or the
    class that builds them); None where the families are the same or either is unknown."""
    ours, theirs = checkpoint_family(model_state), checkpoint_family(checkpoint)
    if ours is None or theirs is None or ours == theirs:
        return None
    structure = _structure(checkpoint, theirs)
    shown = ', '.join(f'{k} {v}' for k, v in structure.items())
    names = _named_models(theirs, structure)
    label, cls = FAMILIES[theirs]
    target = (f"{' or '.join(repr(n) for n in names)} ({cls})" if names
              else f'a {cls} built with those settings')
    return f'it is a {label} checkpoint ({shown}) and the model is a {FAMILIES[ours][0]}: load it into {target}'


def _castable(value: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether copying ``value`` into ``target`` keeps its numbers: any dtype into a non-floating tensor as torch
    copies it, only 16- to 64-bit floats into a floating one."""
    if not target.is_floating_point():
        return True
    return value.is_floating_point() and torch.finfo(value.dtype).bits >= 16


def compare(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> LoadReport:
    own = model.state_dict()
    common = set(own) & set(state_dict)
    return LoadReport(
        missing=sorted(set(own) - set(state_dict)),
        unexpected=sorted(set(state_dict) - set(own)),
        mismatched=sorted((k, tuple(state_dict[k].shape), tuple(own[k].shape))
                          for k in common if state_dict[k].shape != own[k].shape),
        wrong_dtype=tuple(sorted(((k, state_dict[k].dtype, own[k].dtype) for k in common
                                  if not _castable(state_dict[k], own[k])), key=lambda item: item[0])))


class NonFiniteWeightsError(ValueError):
    """The checkpoint holds NaN or Inf weights; nothing was loaded."""


def non_finite_keys(state_dict: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> list[str]:
    """The keys of ``state_dict`` whose floating values are not all finite (NaN or Inf), less those whose tensor in
    ``model`` is not finite either (a buffer the model itself fills with -inf, say)."""
    own = model.state_dict() if model is not None else {}
    bad = []
    for k, v in state_dict.items():
        if isinstance(v, torch.Tensor) and not _finite(v):
            mine = own.get(k)
            if mine is None or _finite(mine):
                bad.append(k)
    return sorted(bad)


def _finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN or Inf (any tensor that is not floating or complex does not)."""
    if not (t.is_floating_point() or t.is_complex()):
        return True
    try:
        return bool(torch.isfinite(t).all())
    except (NotImplementedError, RuntimeError):  # 8-bit floats: no isfinite kernel
        return bool(torch.isfinite(t.float()).all())


def refuse_non_finite(state_dict: Mapping[str, torch.Tensor], model: nn.Module | None = None,
                      source: str = 'checkpoint') -> None:
    """Raise ``NonFiniteWeightsError`` naming every key of ``state_dict`` with NaN or Inf values
    (``non_finite_keys``) and how to load it anyway."""
    bad = non_finite_keys(state_dict, model)
    if bad:
        shown = ', '.join(bad[:20]) + (f', ... ({len(bad) - 20} more)' if len(bad) > 20 else '')
        raise NonFiniteWeightsError(
            f'{source} holds NaN or Inf values in {len(bad)} tensor(s) (nothing was loaded): {shown}. A training '
            'run diverged before it was saved? Use an earlier checkpoint; to load it anyway, pass '
            'allow_nonfinite=True (tools: --allow-nonfinite)')


def built_weights(model: nn.Module, state_dict: Mapping[str, torch.Tensor],
                  skip: Sequence[str] = ()) -> dict[str, torch.Tensor]:
    """``state_dict`` (any known layout) in ours, without the parts the model deliberately does not build
    (``model.unbuilt_prefixes``: a classifier head for a dense backbone, ...) and the key prefixes ``skip``."""
    dropped = tuple(model.unbuilt_prefixes) + tuple(skip)
    return {k: v for k, v in to_native(state_dict).items() if not k.startswith(dropped)}


def load_into(model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True,
              source: str = 'checkpoint', skip: Sequence[str] = (), allow_nonfinite: bool = False) -> LoadReport:
    """Convert ``state_dict`` from any known layout to ours, drop the parts the model deliberately does not
    build (``model.unbuilt_prefixes``: a classifier head for a dense backbone, ...) and those under ``skip``
    (a head to be trained afresh), and load it.

    ``strict=True`` (default) raises ``CheckpointMismatchError`` listing missing, unexpected, shape-mismatched
    keys and values of a kind the model cannot take (``LoadReport``) before anything is copied; a checkpoint of
    another model family is named as such first, with what to load it into, and a few keys of each kind
    (``family_mismatch``).
    ``strict=False`` copies only the keys whose names, shapes and kinds fit and returns the report of the
    rest. A state dict in no known layout (a whole detector's given to a backbone) raises ``UnknownLayoutError``
    naming ``source``. Values that are not finite (NaN, Inf) are refused by key (``NonFiniteWeightsError``) before
    anything is copied, unless ``allow_nonfinite``.
    """
    try:
        sd = built_weights(model, state_dict, skip)
    except UnknownLayoutError as e:
        raise UnknownLayoutError(f'{source}: {e}') from None
    if not allow_nonfinite:
        refuse_non_finite(sd, model, source)
    report = compare(model, sd)
    if skip:
        report = report._replace(missing=[k for k in report.missing if not k.startswith(tuple(skip))])
    if report and strict:
        family = family_mismatch(model.state_dict(), sd)
        raise CheckpointMismatchError(report, source, FAMILY_KEYS_SHOWN if family else 20, family)
    bad = set(report.unexpected) | {k for k, _, _ in report.mismatched} | {k for k, _, _ in report.wrong_dtype}
    model.load_state_dict({k: v for k, v in sd.items() if k not in bad}, strict=False)
    return report


def load_pretrained(model: nn.Module, path: str | Path, strict: bool = True,
                    skip: Sequence[str] = (), allow_nonfinite: bool = False) -> LoadReport:
    """Read ``path`` safely and ``load_into`` the model."""
    return load_into(model, load_weights_file(path), strict, source=str(path), skip=skip,
                     allow_nonfinite=allow_nonfinite)


# What a user's input can be wrong with when weights are read and loaded: each error's message names the file or
# key and what to do, so a tool prints it as one line (``one_line_errors``) instead of a traceback.
USER_ERRORS = (CheckpointMismatchError, NonFiniteWeightsError, WeightFileError, WeightsUnavailableError,
               UnknownLayoutError, pickle.UnpicklingError, FileNotFoundError)


@contextlib.contextmanager
def one_line_errors(tool: str, *more: type[BaseException]):
    """Turn ``USER_ERRORS`` (and ``more``) raised in the block into ``SystemExit('<tool>: <message>')``: the message
    on stderr, exit status 1, no traceback."""
    try:
        yield
    except (*USER_ERRORS, *more) as e:
        raise SystemExit(f'{tool}: {e}') from None
