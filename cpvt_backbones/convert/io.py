"""Reading weight files safely, on every supported torch: ``safe_load`` (a checkpoint pickled under numpy 1.x
loads under numpy 2 and back), ``load_weights_file``, and ``weight_file_problem``, which tells from a file's
content whether it is a weight file at all.
"""
import codecs
import functools
import io
import json
import pickle
import struct
import types
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..compat import supports

StateDict = dict[str, torch.Tensor]
_WRAPPERS = ('state_dict', 'model', 'module')
# Globals that safe loading allows beyond torch's own (tensors, containers, numbers): what an opt-in such as
# cpvt_backbones.adapters.checkpoint registers with allow_globals.
_ALLOWED: list[Callable] = []
# numpy 2 moved numpy.core to numpy._core; pickles name a global by the module it lived in when written.
_NUMPY_MODULES = ('numpy.core.', 'numpy._core.')


class RefusedPickleError(pickle.UnpicklingError):
    """A pickle names a global that safe loading does not construct (it could run code)."""


class WeightFileError(ValueError):
    """A weight file that cannot be read (truncated, corrupt, not a weight file) or whose pickle is refused."""


def allow_globals(objects: Iterable[Callable]) -> None:
    """Let ``safe_load`` construct ``objects`` (classes or functions that build data and run no code) from now on,
    on every torch; the checkpoint opt-in registers mmengine's log buffer and numpy's data types."""
    _ALLOWED.extend(o for o in objects if o not in _ALLOWED)


def numpy_data_types() -> list:
    """numpy's data-only globals (what numpy scalars, arrays and dtypes pickle through), on numpy 1.x and 2."""
    import numpy as np
    core = getattr(np, '_core', None)  # numpy 2; numpy 1.26 has a stub _core without multiarray
    multiarray = core.multiarray if hasattr(core, 'multiarray') else np.core.multiarray
    dtypes = [type(np.dtype(t)) for t in ('float64', 'float32', 'float16', 'int64', 'int32', 'int16', 'int8',
                                          'uint64', 'uint32', 'uint16', 'uint8', 'bool', 'complex64', 'complex128')]
    return [multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype] + dtypes


def global_names(obj: Callable) -> list[str]:
    """The names a pickle may give ``obj`` by: its module and qualified name, and for numpy's core modules the same
    under numpy 1.x's ``numpy.core`` and numpy 2's ``numpy._core`` (the one object either way)."""
    name = f'{obj.__module__}.{obj.__qualname__}'
    for old, new in (_NUMPY_MODULES, _NUMPY_MODULES[::-1]):
        if name.startswith(old):
            return [name, new + name[len(old):]]
    return [name]


@functools.cache
def _names_in_safe_globals() -> bool:
    """Whether this torch's ``safe_globals`` takes ``(object, name)`` pairs (torch >= 2.6): a test of the API."""
    from torch import _weights_only_unpickler as unpickler
    try:
        with torch.serialization.safe_globals([(codecs.encode, 'cpvt_backbones.probe')]):
            return unpickler._get_user_allowed_globals().get('cpvt_backbones.probe') is codecs.encode
    except (AttributeError, TypeError, ValueError):
        return False


def safe_load(source: str | Path | BinaryIO, map_location: Any = 'cpu') -> Any:
    """``torch.load`` that builds only tensors, containers, numbers and the globals of ``allow_globals`` (under
    each of their ``global_names``): a pickle naming anything else (a function that could run code) raises
    ``RefusedPickleError`` ("Unsupported global ..."), with what to do and without torch's advice to load it
    unsafely. On torch >= 2.6 the globals are allowed for this call only (``torch.load(weights_only=True)``);
    earlier, an unpickler applies the same rule."""
    try:
        if supports('safe_globals') and (not _ALLOWED or _names_in_safe_globals()):
            allowed = [(obj, name) for obj in _ALLOWED for name in global_names(obj)] if _ALLOWED else []
            with torch.serialization.safe_globals(allowed):
                return torch.load(source, map_location=map_location, weights_only=True)
        return torch.load(source, map_location=map_location, weights_only=False, pickle_module=_restricted_pickle())
    except RefusedPickleError:
        raise
    except pickle.UnpicklingError as e:
        detail = _unpickler_detail(str(e))
        if not _refused_global(detail):
            raise
        where = f'{source}: ' if isinstance(source, (str, Path)) else ''
        raise RefusedPickleError(
            f'{where}refused by the safe loader (torch.load with weights_only=True and the allowed globals): the '
            f'pickle names a global that could run code ({detail}). Save a plain state dict '
            '(torch.save(model.state_dict(), f)) or convert it with tools/convert_checkpoint.py; an mmengine '
            'checkpoint loads once cpvt_backbones.adapters.checkpoint is imported (our configs list it in '
            'custom_imports)') from None


def _refused_global(detail: str) -> bool:
    detail = detail.lower()
    return any(w in detail for w in ('global', 'unsupported class', 'unrecognized function', 'can only'))


def _restricted_pickle() -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler resolves only allowed globals (torch < 2.6)."""
    from torch._weights_only_unpickler import _get_allowed_globals
    allowed = {}
    for name, obj in _get_allowed_globals().items():
        allowed.update((alias, obj) for alias in ([name] + [n for n in _aliases(name)]))
    allowed.update((name, obj) for obj in _ALLOWED for name in global_names(obj))
    allowed['_codecs.encode'] = codecs.encode  # how protocol 2 pickles bytes (numpy arrays); torch >= 2.5 allows it

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            key = f'{module}.{name}'
            if key not in allowed:
                raise pickle.UnpicklingError(f'Weights only load failed. WeightsUnpickler error: Unsupported '
                                             f'global: GLOBAL {module}.{name} was not an allowed global')
            return allowed[key]

    module = types.ModuleType('cpvt_backbones_restricted_pickle')
    module.Unpickler = Unpickler
    module.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    module.loads = lambda data, **kwargs: Unpickler(io.BytesIO(data), **kwargs).load()
    module.__version__ = pickle.format_version
    return module


def _aliases(name: str) -> list[str]:
    for old, new in (_NUMPY_MODULES, _NUMPY_MODULES[::-1]):
        if name.startswith(old):
            return [new + name[len(old):]]
    return []


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
    """The state dict of a ``.pth``/``.pt``/``.bin`` file (``safe_load``) or of a safetensors file (by its suffix
    or its content), read through ``read_weight_file``: a missing, truncated or corrupt file, and a pickle that
    would construct arbitrary objects (the opt-in ``cpvt_backbones.adapters.checkpoint`` allows mmengine's log
    buffers and numpy scalars), raise an error that names the file.
    """
    try:
        obj = read_weight_file(path)
    except RefusedPickleError as e:
        raise WeightFileError(str(e)) from None
    return unwrap_state_dict(obj)


def read_weight_file(path: str | Path, read: Callable[[Path], Any] | None = None) -> Any:
    """What the weight file at ``path`` holds, as ``read(path)`` gives it (default ``read_weights``): a
    ``FileNotFoundError`` naming it where there is no such file, a ``RefusedPickleError`` as ``safe_load`` raises
    it, and for a file that cannot be read (empty, truncated, corrupt, not a weight file) a ``WeightFileError``
    naming the file and what is wrong with it (``weight_file_problem``; and, for a file in the weights cache, the
    files to delete so that it is fetched again), never a bare reader's error. The one reader of weight files:
    ``load_weights_file`` and mmengine's loading under the checkpoint opt-in (``adapters.checkpoint``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'weight file not found: {path}')
    try:
        return (read or read_weights)(path)
    except RefusedPickleError:
        raise
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        problem = weight_file_problem(path)
        raise WeightFileError(f'{path} is not a readable weight file (truncated or corrupt?): '
                              f'{problem or _unpickler_detail(str(e))}{_cache_hint(path)}') from e


def read_weights(path: str | Path) -> Any:
    """What a weight file holds: a safetensors file's tensors (``.safetensors``, or safetensors content under
    another name), else ``safe_load``."""
    path = Path(path)
    if path.suffix == '.safetensors' or _safetensors_header(path) is not None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return dict(load_file(str(path), device='cpu'))
        except SafetensorError as e:
            raise ValueError(f'not a readable safetensors file: {e}') from e
    return safe_load(path)


def _cache_hint(path: Path) -> str:
    record = path.with_name(path.name + '.sha256')
    if not record.is_file():
        return ''
    return (f'. It is a cached download: delete {path} and its record {record} to have it fetched again, or pass '
            'a good copy as pretrained=PATH')


_TORCH_LEGACY_MAGIC = b'\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19'


def _safetensors_header(path: Path) -> dict | None:
    """The JSON header of a safetensors file whose header and data size agree with the file's size, else None."""
    try:
        size = path.stat().st_size
        with open(path, 'rb') as f:
            head = f.read(8)
            if len(head) < 8:
                return None
            (length,) = struct.unpack('<Q', head)
            if not 2 <= length <= min(size - 8, 100 << 20):
                return None
            header = json.loads(f.read(length))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    ends = [v['data_offsets'][1] for k, v in header.items() if k != '__metadata__' and isinstance(v, dict)
            and isinstance(v.get('data_offsets'), list) and len(v['data_offsets']) == 2]
    return header if 8 + length + max(ends, default=0) == size else None


def weight_file_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a weight file, judged from its content (not its name): None for torch's zip format
    (a zip holding ``data.pkl``), a pickle (torch's legacy format) and safetensors whose header fits the file's
    size; else what it looks like (an HTML or text page, say). Reads only the first bytes and, for a zip, its
    directory."""
    path = Path(path)
    try:
        with open(path, 'rb') as f:
            head = f.read(64)
    except OSError as e:
        return f'it cannot be read ({e})'
    if not head:
        return 'it is empty'
    if head.startswith(b'PK\x03\x04'):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            return f'it is a damaged or truncated zip ({e})'
        if not any(n == 'data.pkl' or n.endswith('/data.pkl') for n in names):
            return f'it is a zip without the data.pkl of a torch file (holds {names[:3]})'
        return None
    if head.startswith(_TORCH_LEGACY_MAGIC) or (len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5):
        return None
    if _safetensors_header(path) is not None:
        return None
    text = head.lstrip().lower()
    if text.startswith((b'<!doctype html', b'<html', b'<head', b'<body')) or b'<html' in text:
        kind = 'an HTML page (a captive portal, a login or a proxy\'s error page?)'
    elif text.startswith((b'<?xml', b'<')):
        kind = 'an XML/HTML document (a server\'s error page?)'
    elif text.startswith((b'{', b'[')):
        kind = 'JSON text (a server\'s error message?)'
    elif all(32 <= c < 127 or c in b'\r\n\t' for c in head):
        kind = 'text'
    else:
        kind = 'none of torch\'s zip or pickle formats, nor safetensors'
    return f'its content is {kind}, not a weight file: it starts with {head[:40]!r}'


def _unpickler_detail(message: str) -> str:
    """The informative line of torch's long weights-only error message, without its advice (to load unsafely,
    or to allow the global)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    detail = lines[0] if lines else message
    for i, line in enumerate(lines):
        if 'WeightsUnpickler error' in line:
            rest = line.split('WeightsUnpickler error:', 1)[1].strip()
            detail = rest or (lines[i + 1] if i + 1 < len(lines) else line)
            break
        if 'unsupported global' in line.lower():  # torch >= 2.6: "Trying to load unsupported GLOBAL posix.system ..."
            detail = line
            break
    return detail.split(' Please use', 1)[0].split(' Check the documentation', 1)[0].rstrip()
