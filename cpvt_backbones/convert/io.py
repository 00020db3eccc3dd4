"""Reading weight files safely, on every supported torch."""
import codecs
import io
import pickle
import types
import zipfile
from pathlib import Path
from typing import Any, BinaryIO
from collections.abc import Callable, Iterable, Mapping

import torch

from ..compat import supports

StateDict = dict[str, torch.Tensor]
_WRAPPERS = ('state_dict', 'model', 'module')
# Globals that safe loading allows beyond torch's own (tensors, containers, numbers): what an opt-in such as
# cpvt_backbones.adapters.checkpoint registers with allow_globals.
_ALLOWED: list[Callable] = []


def allow_globals(objects: Iterable[Callable]) -> None:
    """Let ``safe_load`` construct ``objects`` (classes or functions that build data and run no code) from now on,
    on every torch; the checkpoint opt-in registers mmengine's log buffer and numpy's data types."""
    _ALLOWED.extend(o for o in objects if o not in _ALLOWED)


def safe_load(source: str | Path | BinaryIO, map_location: Any = 'cpu') -> Any:
    """``torch.load`` that builds only tensors, containers, numbers and the globals of ``allow_globals``: a pickle
    naming anything else (a function that could run code) raises ``pickle.UnpicklingError`` ("Unsupported
    global ..."). From torch 2.5 it is ``torch.load(weights_only=True)`` with those globals allowed for this call
    only; on older torch, whose weights-only loader takes no extra globals, the same rule through an unpickler
    that resolves only torch's weights-only globals and those."""
    if supports('safe_globals'):
        with torch.serialization.safe_globals(list(_ALLOWED)):
            return torch.load(source, map_location=map_location, weights_only=True)
    return torch.load(source, map_location=map_location, weights_only=False, pickle_module=_restricted_pickle())


def _global_name(obj: Callable) -> str:
    return f'{obj.__module__}.{obj.__qualname__}'.replace('numpy._core.', 'numpy.core.')


def _restricted_pickle() -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler resolves only allowed globals (torch < 2.5)."""
    from torch._weights_only_unpickler import _get_allowed_globals
    allowed = {name.replace('numpy._core.', 'numpy.core.'): obj for name, obj in _get_allowed_globals().items()}
    allowed.update((_global_name(obj), obj) for obj in _ALLOWED)
    allowed['_codecs.encode'] = codecs.encode  # how protocol 2 pickles bytes (numpy arrays); torch >= 2.5 allows it

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            key = f'{module}.{name}'.replace('numpy._core.', 'numpy.core.')
            if key not in allowed:
                raise pickle.UnpicklingError(f'Weights only load failed. WeightsUnpickler error: Unsupported global: '
                                             f'GLOBAL {module}.{name} was not an allowed global')
            return allowed[key]

    module = types.ModuleType('cpvt_backbones_restricted_pickle')
    module.Unpickler = Unpickler
    module.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    module.loads = lambda data, **kwargs: Unpickler(io.BytesIO(data), **kwargs).load()
    module.__version__ = pickle.format_version
    return module


def unwrap_state_dict(obj) -> StateDict:
    """The tensor mapping inside a checkpoint: a bare state dict, or one under ``state_dict`` (mmengine),
    ``model`` (official Twins/DeiT) or ``module``; a leading ``module.`` (DDP) is stripped."""
    while isinstance(obj, Mapping) and not _is_state_dict(obj):
        inner = next((obj[k] for k in _WRAPPERS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            raise ValueError('checkpoint holds no state dict: expected a mapping of tensors, possibly under '
                             f'one of {list(_WRAPPERS)}; top-level keys are {sorted(obj)[:10]}')
        obj = inner
    if not isinstance(obj, Mapping):
        raise ValueError(f'checkpoint holds no state dict: got {type(obj).__name__}')
    if all(k.startswith('module.') for k in obj):
        obj = {k[len('module.'):]: v for k, v in obj.items()}
    return dict(obj)


def _is_state_dict(obj: Mapping) -> bool:
    return bool(obj) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def load_weights_file(path: str | Path) -> StateDict:
    """The state dict of a ``.pth``/``.pt``/``.bin`` file (``safe_load``) or of a ``.safetensors`` file.

    A pickle that would construct arbitrary objects is refused (the opt-in ``cpvt_backbones.adapters.checkpoint``
    allows mmengine's log buffers and numpy scalars). Truncated or corrupt files raise a ``ValueError`` that
    names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'weight file not found: {path}')
    if path.suffix == '.safetensors':
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return dict(load_file(str(path), device='cpu'))
        except SafetensorError as e:
            raise ValueError(f'{path} is not a readable safetensors file (truncated or corrupt?): {e}') from e
    try:
        obj = safe_load(path)
    except pickle.UnpicklingError as e:
        detail = _unpickler_detail(str(e))
        if 'global' in detail.lower() or 'unsupported class' in detail.lower():
            raise ValueError(
                f'{path} contains pickled objects that torch refuses to load with weights_only=True '
                f'(they could run code). Save a plain state dict (torch.save(model.state_dict(), f)) or '
                f'convert it with tools/convert_checkpoint.py; an mmengine checkpoint loads once '
                f'cpvt_backbones.adapters.checkpoint is imported (our configs list it in custom_imports). '
                f'Detail: {detail}') from e
        raise ValueError(f'{path} is not a readable weight file (truncated or corrupt?): {detail}') from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise ValueError(f'{path} is not a readable weight file (truncated or corrupt?): {e}') from e
    return unwrap_state_dict(obj)


def _unpickler_detail(message: str) -> str:
    """The informative line of torch's long weights-only error message."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if 'WeightsUnpickler error' in line:
            rest = line.split('WeightsUnpickler error:', 1)[1].strip()
            return rest or (lines[i + 1] if i + 1 < len(lines) else line)
        if 'unsupported global' in line.lower():  # torch >= 2.6: "Trying to load unsupported GLOBAL posix.system ..."
            return line
    return lines[0] if lines else message
