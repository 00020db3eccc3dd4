"""Bucketed shapes: inputs of any size run at a few shapes, each output exactly what the input's own size gives.

``Bucketed(module, step)`` pads every input batch bottom/right to the next multiples of ``step`` (its bucket),
runs ``module`` there with each image's valid size (``layers.valid``: the padding is kept at zero and never
attended to) and crops every output map back to the input's grid. The result is what ``module(x,
valid_sizes=...)`` returns for the unpadded batch, to float32 rounding; only the work done differs. An engine
that compiles per input shape (OpenVINO with ``shapes='static'`` or ``'auto'``) then compiles one model per
bucket met, not per size, at the price of the padding (up to ``step - 1`` rows and columns); how many are kept
is the engine's ``cache_size``. ``prepare(model, engine, bucket=step)`` builds it.
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

from ..layers.valid import check_valid_sizes, crop_to_image
from .batched import takes_valid_sizes


def largest_stride(module: nn.Module | None) -> int:
    """The largest stride of ``module``'s maps: of its output maps (``strides``) and its stages or blocks
    (``feature_info``'s reductions); 1 where it declares neither."""
    strides = tuple(getattr(module, 'strides', ()) or ())
    reductions = tuple(f['reduction'] for f in getattr(module, 'feature_info', ()) or () if 'reduction' in f)
    return max((*strides, *reductions), default=1)


def check_step(step: int, module: nn.Module | None = None) -> int:
    """``step`` where it is a positive int and a multiple of ``module``'s ``largest_stride``; a ValueError
    otherwise."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f'bucket must be a positive number of pixels, got {step!r}')
    stride = largest_stride(module)
    if step % stride:
        raise ValueError(f'bucket={step} is not a multiple of the model\'s largest stride {stride}: the padded '
                         'feature maps would not line up with the image\'s')
    return step


class Bucketed(nn.Module):
    """``module`` (whose forward takes ``valid_sizes``) on inputs padded to multiples of ``step`` (module
    docstring). ``forward(x, valid_sizes=None)`` returns ``module(x, valid_sizes=valid_sizes)``'s outputs: maps
    (B, C, h, w) at the input's own grid (ceil(H / s) x ceil(W / s) at stride s), other outputs (logits) as they
    are. ``buckets`` counts the calls per bucket shape (H, W)."""

    def __init__(self, module: nn.Module, step: int = 64):
        super().__init__()
        if not takes_valid_sizes(module):
            raise TypeError(f'bucketed shapes pad inputs, so the module must take valid_sizes (our models, the fused '
                            f'engine, OpenVINO converted with sizes_input=True); {type(module).__name__} does not')
        self.module, self.step = module, check_step(step, module)
        self.buckets: dict[tuple[int, int], int] = {}
        self.in_chans = getattr(module, 'in_chans', 3)
        self.strides = tuple(getattr(module, 'strides', ()) or ())
        self.train(module.training)

    def bucket(self, hw: tuple[int, int]) -> tuple[int, int]:
        """The bucket shape (H, W) an input of ``hw`` runs at."""
        return tuple(-(-n // self.step) * self.step for n in hw)

    def forward(self, x: torch.Tensor, valid_sizes=None):
        from ..models.base import check_input
        check_input(x, self.in_chans)
        H, W = x.shape[-2:]
        sizes = check_valid_sizes(valid_sizes if valid_sizes is not None else [(H, W)] * x.shape[0], x)
        shape = self.bucket((H, W))
        self.buckets[shape] = self.buckets.get(shape, 0) + 1
        out = self.module(F.pad(x, (0, shape[1] - W, 0, shape[0] - H)), valid_sizes=sizes)
        flat, spec = pytree.tree_flatten(out)
        return pytree.tree_unflatten([self._crop(t, shape, (H, W)) for t in flat], spec)

    @staticmethod
    def _crop(t: torch.Tensor, shape: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
        if t.dim() < 4:
            if t.dim() == 3:
                raise ValueError(f'bucketed shapes crop feature maps (B, C, h, w) and keep per-image outputs; an '
                                 f'output of shape {tuple(t.shape)} (tokens?) cannot be cropped to the input')
            return t
        stride = shape[0] // t.shape[-2]
        if t.shape[-2] * stride != shape[0] or t.shape[-1] * stride != shape[1]:
            raise ValueError(f'an output map of {tuple(t.shape[-2:])} does not divide the bucket {shape}: make the '
                             'bucket step a multiple of the model\'s largest stride')
        return crop_to_image(t, hw, stride).contiguous()

    def extra_repr(self) -> str:
        return f'step={self.step}'


__all__ = ['Bucketed', 'check_step', 'largest_stride']
