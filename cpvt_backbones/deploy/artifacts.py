"""The one cache of what engines derive from a model (a conversion, a quantized model, calibrated ranges).

An artifact is its files (``PREFIX[.VARIANT]SUFFIX`` and companions beside it, named by ``artifact_path``, the one
place a cache file is named) and a record, ``<file>.record.json``, written last: each file's sha256, the
``model_fingerprint`` of the model it was made from, what it was made for (``made_for``: the float32 conversion,
or the precision, the ``keep_fp32`` modules and the sha256 of the calibration batches of a calibrated result, and
in both the engine's options that change what is saved), the installed versions of this package, torch and the
engine's packages, and what it was calibrated on. ``Artifact.load`` reuses it only where all of that holds for
the model, request and packages at hand; one that does not (damaged, cut short, made from another model, for
another request or by other versions) is made again with a warning saying what differs, never run.
``Artifact.save`` writes in a temporary folder renamed into place, so a crash never leaves what ``load`` would
take as whole; a cache that cannot be written is skipped with a warning. Which prefixes a request uses
(``EngineRequest.cache`` and ``float_cache``) is decided by its maker: the tools name them by content
(``adapters.engines.cache_name``).
"""
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from ..utils import atomic_write, file_sha256, tensor_bytes

SAVING = '.saving-'  # the prefix of the folder an artifact is written in before it is renamed into place
_SIMPLE = (bool, int, float, str, type(None))


def artifact_path(prefix: str, suffix: str, variant: str = '') -> Path:
    """The file of an artifact: ``PREFIX.VARIANT.SUFFIX`` (``variant``: a kind of conversion kept apart, such as
    OpenVINO's with valid sizes)."""
    return Path(f'{prefix}{"." + variant if variant else ""}{suffix}')


def package_versions(packages: Sequence[str] = ()) -> dict[str, str]:
    """The installed versions of this package, torch and ``packages`` (those installed)."""
    names = dict.fromkeys(['cpvt_backbones', 'torch', *packages])
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _settings(module: nn.Module) -> dict:
    """A module's plain settings: its public attributes that are numbers, strings, None or tuples/lists of them
    (``out_indices``, ``features_only``, ``num_classes``, strides ...), which ``repr`` may not show."""
    out = {}
    for key, value in sorted(vars(module).items()):
        if key.startswith('_') or key == 'training':
            continue
        if isinstance(value, _SIMPLE) or (isinstance(value, (tuple, list)) and all(isinstance(v, _SIMPLE)
                                                                                   for v in value)):
            out[key] = list(value) if isinstance(value, (tuple, list)) else value
    return out


def model_fingerprint(model: nn.Module) -> str:
    """The sha256 of what ``model`` computes: its structure (``repr``, and every submodule's class and plain
    settings, so another ``out_indices`` differs) and its weights (every parameter's and buffer's name, dtype,
    shape and bytes)."""
    digest = hashlib.sha256()
    structure = [repr(model)] + [[name, type(m).__qualname__, _settings(m)] for name, m in model.named_modules()]
    text = json.dumps(structure, default=repr)
    digest.update(re.sub(r' at 0x[0-9a-fA-F]+', '', text).encode())  # no object addresses: the same in every process
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    for name in sorted(tensors):
        t = tensors[name].detach()
        digest.update(f'{name}:{t.dtype}:{tuple(t.shape)};'.encode())
        digest.update(tensor_bytes(t))
    return digest.hexdigest()


def _plain(value):
    """``value`` as JSON reads it back (tuples as lists, other objects as their ``repr``), so that what is asked
    compares equal to what was recorded."""
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def _shown(made_for: dict, key: str) -> str:
    """One entry of what an artifact is made for, as a warning shows it (a sha256 by its first 12 digits)."""
    if key not in made_for:
        return 'none'
    value = made_for[key]
    return f"'{value[:12]}...'" if isinstance(value, str) and re.fullmatch('[0-9a-f]{64}', value) else repr(value)


class Artifact:
    """One saved artifact of ``engine``: ``path`` and the files with ``companions`` (suffixes) beside it, made from
    the model of fingerprint ``source`` by ``versions``, for the request ``made_for`` describes (a JSON-able dict;
    each key is compared on load); ``calibration``: what ``registry.Calibration.describe`` says of the batches it
    was calibrated on, recorded for the reader."""

    def __init__(self, path: Path, engine: str, source: str, versions: dict[str, str],
                 companions: Sequence[str] = (), made_for: dict | None = None, calibration: dict | None = None):
        self.path, self.engine, self.source, self.versions = Path(path), engine, source, versions
        self.made_for, self.calibration = _plain(made_for or {}), calibration
        self.files = {'file': self.path, **{s: self.path.with_suffix(s) for s in companions}}

    @property
    def record(self) -> Path:
        return Path(f'{self.path}.record.json')

    def problem(self) -> str | None:
        """Why what is saved cannot be used for this model, or None."""
        for file in self.files.values():
            if not file.is_file():
                return f'{file} is missing'
        try:
            record = json.loads(self.record.read_text())
        except FileNotFoundError:
            return f'{self.record} is missing (not saved by cpvt_backbones, or its saving was cut short)'
        except (OSError, ValueError) as e:
            return f'{self.record} cannot be read ({e})'
        for key, file in self.files.items():
            if file_sha256(file) != record.get('files', {}).get(key):
                return f'{file} does not have the sha256 recorded in {self.record} (truncated, damaged or replaced)'
        if record.get('source') != self.source:
            return (f"it was made from another model (its structure, settings or weights differ from this one's: "
                    f"recorded {str(record.get('source'))[:12]}..., this model {self.source[:12]}...)")
        recorded = record.get('made_for', {})
        if recorded != self.made_for:
            keys = sorted(set(recorded) | set(self.made_for))
            differ = [f'{key} {_shown(recorded, key)} (asked: {_shown(self.made_for, key)})' for key in keys
                      if recorded.get(key) != self.made_for.get(key)]
            return f'it was made for another request: {", ".join(differ)}'
        if record.get('versions') != self.versions:
            return f"it was made by other package versions ({record.get('versions')}, installed: {self.versions})"
        return None

    def load(self) -> Path | None:
        """``path`` where the artifact is saved and holds for this model, else None (with a warning saying why,
        where something was there)."""
        if not (self.path.exists() or self.record.exists()):
            return None
        problem = self.problem()
        if problem is None:
            return self.path
        self.refuse(problem)
        return None

    def refuse(self, problem: str) -> None:
        """Warn that the saved artifact is not used, and why (it is made again)."""
        warnings.warn(f'{self.engine} cache {self.path}: {problem}; making it again', RuntimeWarning, stacklevel=3)

    def save(self, write: Callable[[Path], None]) -> Path | None:
        """``write(path)`` the artifact (its companions beside ``path``) in a temporary folder beside it, then
        rename every file into place and write the record last; returns ``path``, or None (with a warning) where it
        could not be written. Folders that killed saves left behind are removed."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _remove_abandoned(folder)
            with tempfile.TemporaryDirectory(dir=folder, prefix=f'{SAVING}{os.getpid()}-') as tmp:
                made = {key: Path(tmp) / file.name for key, file in self.files.items()}
                write(made['file'])
                record = dict(files={key: file_sha256(file) for key, file in made.items()}, source=self.source,
                              made_for=self.made_for, versions=self.versions, calibration=self.calibration)
                self.record.unlink(missing_ok=True)  # the old record goes first: a half-renamed set never checks
                for key in sorted(made, key=lambda k: k == 'file'):
                    os.replace(made[key], self.files[key])
                atomic_write(self.record, json.dumps(record, indent=1).encode())
        except OSError as e:
            warnings.warn(f'{self.engine} cache {self.path} not written ({type(e).__name__}: {e}); running without it',
                          RuntimeWarning, stacklevel=3)
            return None
        return self.path


def _remove_abandoned(folder: Path) -> None:
    """Delete the folders that ``save`` of a process no longer running left behind (it was killed mid-write)."""
    for tmp in folder.glob(f'{SAVING}*'):
        try:
            pid = int(tmp.name[len(SAVING):].split('-')[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


class ArtifactCache:
    """The artifacts of one request (``deploy.EngineRequest``) for ``model``: ``result`` at the request's
    ``cache`` prefix, ``conversion`` (the float32 conversion every precision starts from) at its ``float_cache``;
    at a precision the engine does not calibrate the two are one (either prefix names it). ``calibration``: the
    request's ``registry.Calibration`` (None where nothing is calibrated), whose sha256 a calibrated result is
    made for. The model's fingerprint is taken once, only where a prefix is given."""

    def __init__(self, request, model: nn.Module, calibration=None):
        self.request, self.model, self.calibration = request, model, calibration
        self._source: str | None = None

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = model_fingerprint(self.model)
        return self._source

    def made_for(self, calibrated: bool) -> dict:
        """What an artifact of this request is made for: the float32 conversion, or (``calibrated``) the request's
        precision, ``keep_fp32`` and calibration batches (their sha256; None where the ranges were given); with
        the engine's options except those that only change how it runs (``Engine.run_options``)."""
        request = self.request
        options = {k: v for k, v in request.options.items() if k not in request.spec.run_options}
        if not calibrated:
            return dict(precision='fp32', options=options)
        return dict(precision=request.precision, keep_fp32=sorted(request.keep_fp32), options=options,
                    calibration=None if self.calibration is None else self.calibration.sha256)

    def _artifact(self, prefix: str | None, suffix: str, variant: str, companions: Sequence[str],
                  calibrated: bool) -> Artifact | None:
        if not prefix:
            return None
        return Artifact(artifact_path(prefix, suffix, variant), self.request.engine, self.source,
                        package_versions(self.request.spec.requires), companions, self.made_for(calibrated),
                        self.calibration.describe() if calibrated and self.calibration is not None else None)

    def result(self, suffix: str, variant: str = '', companions: Sequence[str] = ()) -> Artifact | None:
        """What the request's precision makes (its own result where the engine calibrates it, else the
        conversion), or None where no prefix names it."""
        request = self.request
        if request.precision in request.spec.calibrated:
            return self._artifact(request.cache, suffix, variant, companions, True)
        return self.conversion(suffix, variant, companions)

    def conversion(self, suffix: str, variant: str = '', companions: Sequence[str] = ()) -> Artifact | None:
        """The float32 conversion, or None where no prefix names it."""
        request = self.request
        plain = request.precision not in request.spec.calibrated
        return self._artifact(request.float_cache or (request.cache if plain else None), suffix, variant, companions,
                              False)


__all__ = ['Artifact', 'ArtifactCache', 'artifact_path', 'model_fingerprint', 'package_versions']
