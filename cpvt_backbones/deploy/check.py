"""The check every converting engine runs once it has converted a model: its outputs against torch's; and what an
engine's cache records it was made from (``model_fingerprint``)."""
import hashlib
import json
import re
from pathlib import Path

import torch
from torch import nn
from torch.utils import _pytree as pytree


def check_against_torch(engine: nn.Module, model: nn.Module, in_chans: int, name: str,
                        size: tuple[int, int] = (97, 131), tolerance: float = 1e-3) -> float:
    """``engine`` (the converted model) against ``model`` on one random input of ``size``, which should not be
    the export's example size, so that a size the export froze shows: the largest relative L2 error over the
    outputs, or a RuntimeError, headed ``name``, naming the output whose shape or values differ."""
    x = torch.randn(1, in_chans, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = pytree.tree_flatten(model(x))[0]
    got = pytree.tree_flatten(engine(x))[0]
    if len(got) != len(expected):
        raise RuntimeError(f'{name}: {len(got)} outputs, torch gives {len(expected)}')
    worst = 0.
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g.shape != e.shape:
            raise RuntimeError(f'{name}: output {i} has shape {tuple(g.shape)} at {size}, torch gives '
                               f'{tuple(e.shape)} (the export froze a size)')
        error = float((g - e).norm() / e.norm().clamp(min=1e-12))
        if error > tolerance:
            raise RuntimeError(f'{name}: output {i} differs from torch by {error:.2e} (relative L2) at {size} (the '
                               'export froze a size, or an operation converts wrongly)')
        worst = max(worst, error)
    return worst


def trace_size(model: nn.Module, size: tuple[int, int]) -> tuple[int, int]:
    """The input size an export traces ``model`` at: ``size`` with each side raised to the largest
    ``min_trace_side`` among its modules (``TwinsSVT``'s), below which the recorded graph holds only for the
    traced size's window grid."""
    side = max((getattr(m, 'min_trace_side', 0) for m in model.modules()), default=0)
    return max(size[0], side), max(size[1], side)


__all__ = ['check_against_torch', 'trace_size']


_SIMPLE = (bool, int, float, str, type(None))


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
    shape and bytes). What an engine's cache records it was made from, and checks before it is used."""
    digest = hashlib.sha256()
    structure = [repr(model)] + [[name, type(m).__qualname__, _settings(m)] for name, m in model.named_modules()]
    text = json.dumps(structure, default=repr)
    digest.update(re.sub(r' at 0x[0-9a-fA-F]+', '', text).encode())  # no object addresses: the same in every process
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    for name in sorted(tensors):
        t = tensors[name].detach()
        digest.update(f'{name}:{t.dtype}:{tuple(t.shape)};'.encode())
        if t.numel():
            digest.update(t.to('cpu').contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def source_problem(record: Path, source: str) -> str | None:
    """Why the cache whose JSON ``record`` this is does not belong to the model of fingerprint ``source``, or
    None."""
    try:
        recorded = json.loads(Path(record).read_text()).get('source')
    except (OSError, ValueError, AttributeError) as e:
        return f'its record {record} cannot be read ({e})'
    if recorded is None:
        return ('its record names no model it was made from (saved by an older version, or by save() without '
                'source=)')
    if recorded != source:
        return ('it was made from another model (its structure, settings or weights differ from this one\'s: '
                f'recorded {recorded[:12]}..., this model {source[:12]}...)')
    return None
