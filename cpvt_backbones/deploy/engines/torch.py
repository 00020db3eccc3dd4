"""The torch engine: PyTorch eager, the model as it is at float32; at bf16 under ``torch.autocast``, its outputs
handed back in float32.

Autocast runs the GEMMs, attention and convolutions of the whole model in bf16 (LayerNorm, softmax and the
reductions stay float32), with no copy of the weights and nothing changed in the model; for an OpenMMLab model it
covers backbone, neck and head. ``prepare(model, 'torch', 'bf16')`` returns an ``AutocastModule``, whose floating
outputs come back as float32; without native bf16 it warns and returns the model as it is (``_prepare``).
"""
import warnings

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ...compat import tree_leaves
from ..registry import Engine, EngineModule, in_chans_of, register


def native_bf16(device_type: str = 'cpu') -> bool:
    """Whether ``device_type`` runs bf16 natively: on a CPU, oneDNN's bf16 support (avx512_bf16 or AMX); on
    CUDA, ``torch.cuda.is_bf16_supported()``."""
    if device_type == 'cuda':
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _float32(value):
    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


class AutocastModule(EngineModule, nn.Module):
    """``module`` (a submodule: ``eval``, ``to`` and the state dict reach it under ``module.``) called under
    ``torch.autocast`` on the device of its input, in bf16; floating outputs, in any tuple, list or dict, are
    returned as float32. Where ``module``'s forward takes ``valid_sizes``
    (a padded batch computed as if each image were alone, ``layers.valid``), so does this one's, handing them on
    (an instance of the subclass ``ValidSizesAutocastModule``), so that ``run_images`` pads mixed sizes and
    ``deploy.bucketed.Bucketed`` runs it; ``strides`` are ``module``'s, ``in_chans`` ``registry.in_chans_of`` it."""

    engine = 'torch'

    def __new__(cls, module: nn.Module | None = None):
        from ..batched import takes_valid_sizes
        if cls is AutocastModule and module is not None and takes_valid_sizes(module):
            cls = ValidSizesAutocastModule
        return super().__new__(cls)

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.strides = tuple(getattr(module, 'strides', ()) or ())   # its output maps' (run_images crops by them)
        self.in_chans = in_chans_of(module, {})
        self.train(module.training)

    def forward(self, *args, **kwargs):
        device = next((a.device.type for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)),
                      'cpu')
        with torch.autocast(device, dtype=torch.bfloat16):
            out = self.module(*args, **kwargs)
        return pytree.tree_map(_float32, out)

class ValidSizesAutocastModule(AutocastModule):
    """An ``AutocastModule`` of a module whose forward takes ``valid_sizes``: ``forward(*args, valid_sizes=None,
    **kwargs)`` hands them on (none given: the module's own default)."""

    def forward(self, *args, valid_sizes=None, **kwargs):
        if valid_sizes is not None:
            kwargs['valid_sizes'] = valid_sizes
        return super().forward(*args, **kwargs)


def _prepare(module: nn.Module, request, calibration=None, cache=None) -> nn.Module:
    """``module`` itself at fp32; under autocast at bf16 on the device of its parameters, where that device runs
    bf16 natively (elsewhere a warning, and ``module`` itself)."""
    if request.precision == 'fp32':
        return module
    device = next((p.device.type for p in module.parameters()), 'cpu')
    if not native_bf16(device):
        warnings.warn(f"precision='bf16': this {device.upper()} has no native bf16 (avx512_bf16 or AMX on a CPU), so "
                      'autocast would emulate it, slower than float32; running float32', RuntimeWarning, stacklevel=3)
        return module
    return AutocastModule(module)


register(Engine(
    'torch', 'model', {'fp32': 'everything',
                       'bf16': "autocast's float32 operations (norms, softmax, reductions); outputs returned in "
                               'float32'},
    _prepare, 'PyTorch eager; bf16 under torch.autocast (native bf16 CPUs; elsewhere float32, with a warning)',
    trains=('fp32', 'bf16'), bucketing={}))

__all__ = ['AutocastModule', 'ValidSizesAutocastModule', 'native_bf16']
