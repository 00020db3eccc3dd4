"""The check every converting engine runs once it has converted a model: its outputs against torch's."""
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


def check_example_size(model: nn.Module | None, size) -> tuple[int, int]:
    """``size`` (the option ``example_size``, the input size an export is traced at) as (height, width); a
    ValueError unless it is two ints of at least 2 (``torch.export`` fixes a dimension it meets as 0 or 1) and, with
    ``model``, of at least twice its largest stride (every map it traces at least 2 x 2)."""
    from .bucketed import largest_stride
    if isinstance(size, (str, bytes)) or not hasattr(size, '__len__') or len(size) != 2 or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in size):
        raise ValueError(f'example_size must be (height, width), two ints, got {size!r}')
    least = 2 if model is None else 2 * max((largest_stride(m) for m in model.modules()), default=1)
    if min(size) < least:
        raise ValueError(f'example_size must be at least {least} x {least}'
                         + (f' (twice the largest stride of {type(model).__name__}, so that every map it traces is at '
                            'least 2 x 2)' if model is not None else ' (an export fixes a side it traces at 1)')
                         + f', got {tuple(size)}; any size runs after the export')
    return int(size[0]), int(size[1])


def trace_size(model: nn.Module, size: tuple[int, int]) -> tuple[int, int]:
    """The input size an export traces ``model`` at: ``size`` with each side raised to the largest
    ``min_trace_side`` among its modules (``TwinsSVT``'s), below which the recorded graph holds only for the
    traced size's window grid."""
    side = max((getattr(m, 'min_trace_side', 0) for m in model.modules()), default=0)
    return max(size[0], side), max(size[1], side)


__all__ = ['check_against_torch', 'check_example_size', 'trace_size']
