"""Running a segmentation model that needs input sizes divisible by some multiple (segmentation_models_pytorch's
decoders: ``output_stride``, 32 for these backbones) at any input size.

With ``import cpvt_backbones.adapters.timm``, every model of ``cpvt_backbones.list_models()`` is an SMP encoder
under ``'tu-<name>'`` (``smp.Unet('tu-pcpvt_tiny', encoder_weights=None)``; ``encoder_weights='imagenet'`` loads
the published PCPVT weights through timm's ``pretrained=True``). ``AnySize`` is plain torch and needs no SMP.
"""
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PAD_MODES = ('constant', 'reflect', 'replicate')


class AnySize(nn.Module):
    """``model`` at any input size: the (B, C, H, W) input is padded at the bottom and right to the next multiple
    of ``multiple`` (``mode``: 'constant' pads zeros, the default, which is the dataset mean of a normalised
    image; 'reflect' mirrors the image and needs each pad smaller than that side, i.e. H, W > multiple - 1 at
    worst; 'replicate' repeats the last row and column), run through ``model``, and every 4-D output tensor whose
    spatial size is the padded one is cropped back to [:H, :W] (other outputs, such as SMP's classification head,
    pass unchanged; tuples, lists and dicts are walked). The result is exactly ``model`` on the padded input,
    cropped: padding changes what the model sees near the bottom and right border, so it is not the result
    ``model`` would give at H x W if it could take that size.

    ``multiple`` None infers it from SMP: ``model.encoder.output_stride`` for a model that requires divisible
    sizes (``requires_divisible_input_shape``), 1 (no padding) for one that does not (SMP's Unet); any other
    model needs it given. Sizes already divisible pass unpadded.
    """

    def __init__(self, model: nn.Module, multiple: int | None = None, mode: str = 'constant'):
        super().__init__()
        if multiple is None:
            stride = getattr(getattr(model, 'encoder', None), 'output_stride', None)
            if stride is None:
                raise ValueError(f'cannot infer the size multiple of a {type(model).__name__} (no '
                                 'encoder.output_stride, as SMP models have): pass multiple=')
            multiple = int(stride) if getattr(model, 'requires_divisible_input_shape', True) else 1
        if not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1:
            raise ValueError(f'multiple must be a positive int, got {multiple!r}')
        if mode not in PAD_MODES:
            raise ValueError(f'mode must be one of {PAD_MODES}, got {mode!r}')
        self.model = model
        self.multiple = multiple
        self.mode = mode

    def forward(self, x: torch.Tensor) -> Any:
        h, w = x.shape[-2:]
        m = self.multiple
        ph, pw = -h % m, -w % m
        if not (ph or pw):
            return self.model(x)
        if self.mode == 'reflect' and (ph >= h or pw >= w):
            raise ValueError(f"mode='reflect' pads by less than the input's side: {h} x {w} needs {ph} x {pw} rows "
                             f"and columns to reach a multiple of {m}; use mode='constant' or 'replicate'")
        padded = F.pad(x, (0, pw, 0, ph), mode=self.mode)
        return _crop(self.model(padded), padded.shape[-2:], h, w)


def _crop(out: Any, padded_hw, h: int, w: int) -> Any:
    if isinstance(out, torch.Tensor):
        return out[..., :h, :w] if out.ndim == 4 and out.shape[-2:] == padded_hw else out
    if isinstance(out, (tuple, list)):
        return type(out)(_crop(o, padded_hw, h, w) for o in out)
    if isinstance(out, dict):
        return {k: _crop(v, padded_hw, h, w) for k, v in out.items()}
    return out


__all__ = ['AnySize', 'PAD_MODES']
