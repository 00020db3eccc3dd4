"""The check every converting engine runs once it has converted a model (its outputs against torch's), the input
size an export traces at, and what an export with each image's valid size as a second input needs
(``check_sized_conversion``, ``WithSizes``)."""
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


def per_image_modules(model: nn.Module, in_chans: int) -> list[str]:
    """The names of ``model``'s modules ('' for the model itself) whose valid-size path works image by image in
    Python (``layers.valid.watch_per_image``), which an export cannot record; found by one eager call, without
    gradients, on a small padded batch of two images."""
    from ..layers.valid import watch_per_image
    from .bucketed import largest_stride
    stride = largest_stride(model)
    side = stride * max(2, -(-32 // stride))
    x = torch.randn(2, in_chans, side, side, generator=torch.Generator().manual_seed(0))
    names = {id(module): name for name, module in model.named_modules()}
    found: list[str] = []

    def seen(module):
        name = names.get(id(module), '' if module is None else type(module).__name__)
        if name not in found:
            found.append(name)

    with torch.no_grad(), watch_per_image(seen):
        model(x, valid_sizes=torch.tensor([[side, side], [side // 2, side]]))
    return found


class PerImagePathError(ValueError):
    """A model's valid-size path works image by image in Python, which an export cannot record."""


def check_sized_conversion(model: nn.Module, in_chans: int, what: str) -> None:
    """Before anything is exported with each image's valid size as an input (``what``: how, for the message, e.g.
    'converted with sizes_input'): a TypeError where ``model``'s forward takes no ``valid_sizes``, a
    ``PerImagePathError`` naming the modules whose valid-size path works image by image (``per_image_modules``)."""
    from .batched import takes_valid_sizes
    if not takes_valid_sizes(model):
        raise TypeError(f'{type(model).__name__} cannot be {what}: its forward takes no valid_sizes (our models do)')
    modules = per_image_modules(model, in_chans)
    if modules:
        raise PerImagePathError(f'{type(model).__name__} cannot be {what}: its valid-size path does not trace: '
                                f'that of module(s) {", ".join(repr(m) for m in modules)} works image by image in '
                                'Python (a learned position table, or a PEG padding other than zeros); export it '
                                'without valid sizes')


class WithSizes(nn.Module):
    """``model`` with each image's valid size as a second positional input (``forward(x, sizes)`` is
    ``model(x, valid_sizes=sizes)``), as ``torch.export`` and ONNX take inputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.train(model.training)

    def forward(self, x: torch.Tensor, sizes: torch.Tensor):
        return self.model(x, valid_sizes=sizes)


__all__ = ['PerImagePathError', 'WithSizes', 'check_against_torch', 'check_example_size', 'check_sized_conversion',
           'per_image_modules', 'trace_size']
