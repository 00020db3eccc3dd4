"""The torch engine's bf16: a built model run under ``torch.autocast``, its outputs handed back in float32.

Autocast runs the GEMMs, attention and convolutions of the whole model in bf16 (LayerNorm, softmax and the
reductions stay float32), with no copy of the weights and nothing changed in the model. For an OpenMMLab model
it covers backbone, neck and head (``deploy.openmmlab.on_engine(model, 'torch', 'bf16')``); how it compares with
the other engines is measured in docs/performance.md (lower precision).

``to_autocast(model, 'bf16')`` returns an ``AutocastModule`` with the model's call contract: floating outputs
come back as float32, so what follows (a classifier's loss, box decoding, NMS) runs as on the float32 model.
A CPU without native bf16 (avx512_bf16 or AMX) would emulate it, slower than float32: there it warns and runs
float32. int8 is not an autocast type: the fused and OpenVINO engines run it (``deploy.ENGINES``).
"""
import warnings

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..compat import tree_leaves
from .precision import check_precision

_DTYPES = {'bf16': torch.bfloat16}


def native_bf16(device_type: str = 'cpu') -> bool:
    """Whether ``device_type`` runs bf16 natively: on a CPU, oneDNN's bf16 support (avx512_bf16 or AMX); on
    CUDA, ``torch.cuda.is_bf16_supported()``."""
    if device_type == 'cuda':
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _float32(value):
    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


class AutocastModule(nn.Module):
    """``module`` (a submodule: ``eval``, ``to`` and the state dict reach it under ``module.``) called under
    ``torch.autocast`` on the device of its input, in ``precision``; floating outputs, in any tuple, list or
    dict, are returned as float32. ``'fp32'`` calls it as it is. Where ``module``'s forward takes ``valid_sizes``
    (a padded batch computed as if each image were alone, ``layers.valid``), so does this one's, handing them on
    (an instance of the subclass ``ValidSizesAutocastModule``), so that ``run_images`` pads mixed sizes and
    ``deploy.bucketed.Bucketed`` runs it; ``strides`` and ``in_chans`` are ``module``'s."""

    def __new__(cls, module: nn.Module | None = None, precision: str = 'bf16'):
        from .batched import takes_valid_sizes
        if cls is AutocastModule and module is not None and takes_valid_sizes(module):
            cls = ValidSizesAutocastModule
        return super().__new__(cls)

    def __init__(self, module: nn.Module, precision: str = 'bf16'):
        super().__init__()
        check_precision(precision)
        if precision == 'int8':
            raise ValueError("precision='int8' is not an autocast type: use optimize(model, precision='int8') (the "
                             "fused engine: static int8, torch only) or the OpenVINO engine (NNCF), both through "
                             "deploy.prepare(model, ENGINE, 'int8', ...)")
        self.module, self.precision = module, precision
        self.strides = tuple(getattr(module, 'strides', ()) or ())   # its output maps' (run_images crops by them)
        self.in_chans = getattr(module, 'in_chans', 3)
        self.train(module.training)

    def forward(self, *args, **kwargs):
        if self.precision == 'fp32':
            return self.module(*args, **kwargs)
        device = next((a.device.type for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)),
                      'cpu')
        with torch.autocast(device, dtype=_DTYPES[self.precision]):
            out = self.module(*args, **kwargs)
        return pytree.tree_map(_float32, out)

    def extra_repr(self) -> str:
        return f'precision={self.precision}'


class ValidSizesAutocastModule(AutocastModule):
    """An ``AutocastModule`` of a module whose forward takes ``valid_sizes``: ``forward(*args, valid_sizes=None,
    **kwargs)`` hands them on (none given: the module's own default)."""

    def forward(self, *args, valid_sizes=None, **kwargs):
        if valid_sizes is not None:
            kwargs['valid_sizes'] = valid_sizes
        return super().forward(*args, **kwargs)


def to_autocast(model: nn.Module, precision: str = 'bf16', device_type: str = 'cpu') -> AutocastModule:
    """``model`` under autocast in ``precision`` on ``device_type`` (see the module docstring); where the device
    has no native bf16 it warns and the module runs float32."""
    check_precision(precision)
    if precision == 'bf16' and not native_bf16(device_type):
        warnings.warn(f"precision='bf16': this {device_type.upper()} has no native bf16 (avx512_bf16 or AMX on a "
                      "CPU), so autocast would emulate it, slower than float32; running float32",
                      RuntimeWarning, stacklevel=2)
        precision = 'fp32'
    return AutocastModule(model, precision)


__all__ = ['AutocastModule', 'ValidSizesAutocastModule', 'native_bf16', 'to_autocast']
