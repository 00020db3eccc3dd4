"""Reading weight files safely."""
import pickle
import zipfile
from pathlib import Path
from typing import Dict, Mapping, Union

import torch

StateDict = Dict[str, torch.Tensor]
_WRAPPERS = ('state_dict', 'model', 'module')


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


def load_weights_file(path: Union[str, Path]) -> StateDict:
    """Load a ``.pth``/``.pt``/``.bin`` file with ``torch.load(weights_only=True)`` or a ``.safetensors`` file.

    A pickle that would construct arbitrary objects is refused (the opt-in ``cpvt_backbones.adapters.checkpoint``
    allows mmengine's log buffers and numpy scalars globally). Truncated or corrupt files raise a ``ValueError``
    that names the file.
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
        obj = torch.load(path, map_location='cpu', weights_only=True)
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
    return lines[0] if lines else message
