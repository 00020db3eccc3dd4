"""The CPU fast path: modules that run a block with the bias and the residual add fused into its GEMMs, in
float32 or int8.

In eager PyTorch a linear layer is a GEMM plus a pass that copies the bias into the output, and GELU and the
residual add are passes of their own over activations up to 8x wider than the tokens. Here the residual is
accumulated by the GEMM itself and the MLP runs a chunk of tokens at a time, so that its wide hidden
activation is written, biased, activated and read back while it is still in cache, and is never allocated
whole: under glibc's default allocator a block that large goes back to the OS when freed, and the plain model
then pays a page fault per 4 KiB of it on every call (most of this path's lead; docs/performance.md).

A ``Kernel`` runs a linear layer's GEMM on 2-D float32 tokens (``KERNELS``):

* ``mkl``, ``onednn``: float32. oneDNN adds the bias and the residual in its GEMM epilogue (and runs AVX-512
  code where MKL runs AVX2 code, on AMD CPUs); MKL's ``addmm`` accumulates into the residual (beta = 1) and
  biases the cached chunk in place. Which is faster depends on the CPU (``deploy.engines.fused`` times both).
* ``onednn_int8``: static int8 through oneDNN: int8 weights per output channel (symmetric, made once),
  activations quantized to uint8 with a scale and zero point fixed by calibration (``FusedLinear.input_range``,
  from ``deploy.record_input_ranges``); bias and residual in the GEMM's epilogue, and in the MLP the first GEMM
  applies GELU and writes the hidden activation as uint8 in the second GEMM's quantization, so it is never
  float32 at all. On CPUs without int8 dot-product instructions (AVX2 without VNNI) the activations use 7 bits
  (``activation_qmax``), as PyTorch's x86 quantization backends do (``reduce_range``).

These modules are not part of the models: the fused engine (``deploy.engines.fused``) swaps them in for a built model's
blocks and linear layers, sharing the same parameters (an int8 copy of a weight is derived data, not in
the state dict). They read ``weight``/``bias`` directly, so hooks on the linear layers inside a fused block do
not fire in the fused path; the plain model is the one to instrument. The fused path runs where it applies:
float32 inputs on a CPU, no autocast, and not while tracing, compiling or exporting (those record the plain ops).
At float32 it also needs autograd off (and eval mode for a block); elsewhere, training included, the modules take
the plain float32 path, which gives the same outputs and backpropagates. int8 is int8 with autograd on or off, the
same outputs either way: its GEMMs have no gradient, so an int8 layer (and, in eval mode, a block holding one)
computes without autograd and its output carries no gradient back to its input or weights (int8 does not
backpropagate); in training mode with autograd on it refuses by name (int8 does not train: train the float32
model).
"""
import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..compat import FEATURES, autocast_enabled, supports
from ..layers.block import Block
from ..layers.layout import symbolic_shapes
from ..layers.position.base import AttentionPosition
from ..layers.valid import WHOLE, Region
from ..utils import cpu_flags
from .registry import EngineModule

# Tokens per chunk of the fused MLP: the chunk's hidden activation stays in cache between the two GEMMs and the
# GELU instead of going out to memory and back (the chunk sizes compared: docs/performance.md).
MLP_CHUNK_TOKENS = 2048


def onednn_linear():
    """oneDNN's fused linear operator, or None where this torch build has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_LINEAR = onednn_linear()


def can_fuse(x: torch.Tensor, int8: bool = False) -> bool:
    """Whether the fused kernels may replace the plain ops for ``x`` (see the module docstring): float32 on a CPU,
    no autocast, no graph being recorded, and no autograd unless ``int8`` (int8 kernels run without autograd
    whether or not it is on)."""
    return ((int8 or not torch.is_grad_enabled()) and x.device.type == 'cpu' and x.dtype == torch.float32
            and not autocast_enabled('cpu') and not symbolic_shapes())


def refuse_int8_training(module: nn.Module) -> None:
    """Refuse, by name, to run ``module`` (holding int8 layers) in training mode with autograd on: its int8 GEMMs
    have no gradient."""
    if module.training and torch.is_grad_enabled():
        raise RuntimeError(f'{type(module).__name__} runs static int8, which does not backpropagate (its int8 GEMMs '
                           'have no gradient) and so does not train: train the float32 model (or prepare it with '
                           "precision='fp32'), call eval() for inference, or run under torch.no_grad()")


class Kernel:
    """How a linear layer's GEMM runs on 2-D float32 tokens: ``pack`` derives what the kernel needs from the
    layer once (None: the layer's own parameters), ``linear`` returns ``layer(x)``, ``residual`` returns
    ``other + layer(x)`` and ``accumulate`` adds ``layer(x)`` to ``part`` in place. The base class states these
    through ``linear``; float32 kernels fuse them into the GEMM."""
    precision = 'fp32'

    def available(self) -> bool:
        return True

    def pack(self, layer: nn.Module):
        return None

    def linear(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        raise NotImplementedError

    def residual(self, x: torch.Tensor, layer: nn.Module, other: torch.Tensor) -> torch.Tensor:
        return self.linear(x, layer).add_(other)

    def accumulate(self, part: torch.Tensor, x: torch.Tensor, layer: nn.Module) -> None:
        part += self.linear(x, layer)

    def gelu_linear(self, x: torch.Tensor, layer: nn.Module, consumer: nn.Module | None = None) -> torch.Tensor:
        """``gelu(layer(x))``, in the form the kernel of ``consumer`` (the layer it feeds) takes."""
        return torch.ops.aten.gelu_(self.linear(x, layer))


class OneDNN(Kernel):
    """float32 through oneDNN: bias and residual in the GEMM's epilogue."""

    def available(self) -> bool:
        return _LINEAR is not None

    def linear(self, x, layer):
        return _LINEAR(x, layer.weight, layer.bias, 'none', [], '')

    def residual(self, x, layer, other):
        return _LINEAR.binary(x, other, layer.weight, layer.bias, 'add')


class MKL(Kernel):
    """float32 through MKL's ``addmm``: the product accumulated into the residual (beta = 1)."""

    def linear(self, x, layer):
        return x @ layer.weight.t() if layer.bias is None else torch.addmm(layer.bias, x, layer.weight.t())

    def residual(self, x, layer, other):
        out = torch.addmm(other, x, layer.weight.t())
        return out if layer.bias is None else out.add_(layer.bias)

    def accumulate(self, part, x, layer):
        if layer.bias is not None:
            part += layer.bias
        part.addmm_(x, layer.weight.t())


def channel_scales(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 scale of each output channel (row) of a linear layer's weight: its largest magnitude / 127."""
    return (weight.abs().amax(dim=1) / 127).clamp(min=1e-8)


def _int8_weight(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 weights per output channel, symmetric (zero point 0), and their float32 scales."""
    weight = layer.weight.detach()
    scales = channel_scales(weight)
    return torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8), scales


@functools.cache
def activation_qmax() -> int:
    """The largest uint8 activation code: 255 on CPUs with int8 dot-product instructions (AVX512-VNNI, AVX-VNNI,
    AMX), whose GEMMs add exact 32-bit products; 127 elsewhere, where oneDNN's AVX2 kernel adds pairs of
    u8 x s8 products in saturating 16-bit arithmetic, which products of 8-bit activations can overflow (as
    PyTorch's x86 quantization backends do with ``reduce_range``)."""
    flags = cpu_flags()
    return 255 if not flags or flags & {'avx512_vnni', 'avx_vnni', 'amx_int8'} else 127


def uint8_qparams(low: float, high: float) -> tuple[float, int]:
    """Scale and zero point mapping [low, high] (widened to include 0, so that 0 is exact) onto the uint8 codes
    0..``activation_qmax()``."""
    qmax = activation_qmax()
    low, high = min(low, 0.), max(high, 0.)
    scale = max(high - low, 1e-8) / qmax
    return scale, int(min(qmax, max(0, round(-low / scale))))


@functools.lru_cache(maxsize=4096)
def _float32_inverse(scale: float) -> float:
    """1 / ``scale`` computed in float32, as torch's quantizer does; once per calibrated scale, not per call."""
    return float(torch.tensor(scale, dtype=torch.float32).reciprocal())


class OneDNNInt8(Kernel):
    """Static int8 through oneDNN: uint8 activations with a calibrated scale and zero point (the layer's
    ``input_range``), int8 weights per output channel, float32 out; bias, residual and (in the MLP) GELU in the
    GEMM's epilogue."""
    precision = 'int8'

    def available(self) -> bool:
        return supports('int8_kernel') and torch.backends.mkldnn.is_available()

    def pack(self, layer):
        if getattr(layer, 'input_range', None) is None:
            raise RuntimeError(f'kernel onednn_int8 needs the range of the layer\'s input ({layer}): prepare the '
                               "model on the fused engine at int8 (calibration=..., or input_ranges=...)")
        qweight, scales = _int8_weight(layer)
        packed = torch.ops.onednn.qlinear_prepack(qweight, None)
        bias = None if layer.bias is None else layer.bias.detach()
        return (packed, scales, torch.zeros_like(scales, dtype=torch.long), bias) + uint8_qparams(*layer.input_range)

    @staticmethod
    def quantize(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
        """float32 to uint8: round(x / scale) + zero_point (ties to even), saturated at 0 and
        ``activation_qmax()``, in plain tensor arithmetic on one float32 buffer (the same codes as torch's
        deprecated ``quantize_per_tensor``, which is not used; ``benchmarks/int8_quantize.py`` times both)."""
        codes = torch.mul(x, _float32_inverse(scale))
        codes.round_().add_(zero_point).clamp_(0, activation_qmax())
        return codes.to(torch.uint8)

    def _input(self, x, layer):
        """``x`` quantized for ``layer`` (already uint8: quantized by the previous GEMM for this layer)."""
        packed, w_scales, w_zeros, bias, scale, zero = layer.packed
        qx = x if x.dtype == torch.uint8 else self.quantize(x, scale, zero)
        return qx, scale, zero, packed, w_scales, w_zeros, bias

    def linear(self, x, layer):
        return torch.ops.onednn.qlinear_pointwise(*self._input(x, layer), 1.0, 0, torch.float32, 'none', [], '')

    def residual(self, x, layer, other):
        out = other.clone()
        self.accumulate(out, x, layer)
        return out

    def accumulate(self, part, x, layer):
        qx, scale, zero, packed, w_scales, w_zeros, bias = self._input(x, layer)
        torch.ops.onednn.qlinear_pointwise.binary(qx, scale, zero, packed, w_scales, w_zeros, part, bias, 1.0, 0,
                                                  torch.float32, 1.0, 0, 'sum', 1.0, 'none', [], '')

    def gelu_linear(self, x, layer, consumer=None):
        if consumer is None or consumer.kernel != 'onednn_int8':
            return super().gelu_linear(x, layer)
        out_scale, out_zero = consumer.packed[4:]
        return _saturate(torch.ops.onednn.qlinear_pointwise(*self._input(x, layer), out_scale, out_zero,
                                                            torch.uint8, 'gelu', [], 'none'))


def _saturate(codes: torch.Tensor) -> torch.Tensor:
    """uint8 activation codes capped, in place, at ``activation_qmax()`` (a no-op at 255)."""
    qmax = activation_qmax()
    return codes if qmax == 255 else codes.clamp_(max=qmax)


KERNELS = {'mkl': MKL(), 'onednn': OneDNN(), 'onednn_int8': OneDNNInt8()}
GEMMS = tuple(k for k in ('mkl', 'onednn') if KERNELS[k].available())  # float32: the fused engine picks the faster


def check_kernel(name: str) -> str:
    """``name`` if it names a kernel this torch build and CPU can run, else a clear error."""
    if name not in KERNELS:
        raise ValueError(f'kernel must be one of {sorted(KERNELS)}, got {name!r}')
    if not KERNELS[name].available():
        raise RuntimeError(f"kernel {name!r} cannot run here ({unavailable_reason(name)})")
    return name


def unavailable_reason(name: str) -> str:
    return {'onednn': 'this torch build has no oneDNN (torch.backends.mkldnn)',
            'onednn_int8': (f"this torch ({torch.__version__}) lacks {FEATURES['int8_kernel'][1]}, which came with "
                            f"torch {FEATURES['int8_kernel'][0]}" if torch.backends.mkldnn.is_available()
                            else 'this torch build has no oneDNN'),
            }.get(name, 'unavailable')


def fused_mlp(part: torch.Tensor, norm: nn.Module, fc1: nn.Module, fc2: nn.Module,
              kernel: str | None = None) -> None:
    """``part += fc2(gelu(fc1(norm(part))))`` on a 2-D chunk of tokens, in place; each layer through its own
    kernel unless ``kernel`` names one for both."""
    k1, k2 = (KERNELS[kernel or layer.kernel] for layer in (fc1, fc2))
    hidden = k1.gelu_linear(norm(part), fc1, None if kernel else fc2)
    k2.accumulate(part, hidden, fc2)


def fused_gemms(attended: torch.Tensor, block: nn.Module, residual: torch.Tensor,
                kernel: str | None = None) -> torch.Tensor:
    """What follows attention in a block, on 2-D tokens: ``x = residual + proj(attended)``, then
    ``x += mlp(norm2(x))`` a chunk at a time; each layer through its own kernel unless ``kernel`` names one
    (a float32 kernel needs nothing packed, so it runs the plain block's layers too)."""
    proj = block.attn.proj
    flat = KERNELS[kernel or proj.kernel].residual(attended, proj, residual)
    for start in range(0, flat.shape[0], MLP_CHUNK_TOKENS):
        fused_mlp(flat[start:start + MLP_CHUNK_TOKENS], block.norm2, block.mlp.fc1, block.mlp.fc2, kernel)
    return flat


class FusedLinear(EngineModule, nn.Module):
    """An ``nn.Linear``'s parameters (shared, same key names) applied through ``kernel`` where ``can_fuse``
    allows, else with ``F.linear``. ``packed`` is what the kernel derives from the weights (packed
    packed int8 weights) and ``input_range``, not part of the state dict: derived again whenever the weight,
    bias or range changes (a checkpoint loaded after ``prepare``, as OpenMMLab's runners do)."""

    engine = 'fused'

    def __init__(self, layer: nn.Linear, kernel: str = 'onednn'):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.kernel = check_kernel(kernel)
        self.weight = layer.weight
        self.bias = layer.bias
        self.input_range: tuple[float, float] | None = None  # calibrated (low, high) of the input: static int8
        self._packed, self._packed_for = None, None
        self.train(layer.training)

    def __getstate__(self):
        """Copies and pickles leave out what the kernel derived (oneDNN's packed weights cannot be copied); it is
        derived again on first use."""
        state = super().__getstate__()
        return dict(state, _packed=None, _packed_for=None)

    @property
    def packed(self):
        # An inference tensor (made under torch.inference_mode) has no version counter: its data pointer alone
        # tells a replaced tensor (in-place edits of one, possible only in inference mode, are not seen).
        state = tuple((t.data_ptr(), None if t.is_inference() else t._version)
                      for t in (self.weight, self.bias) if t is not None) + (self.input_range,)
        if state != self._packed_for:
            self._packed, self._packed_for = KERNELS[self.kernel].pack(self), state
        return self._packed

    @property
    def int8(self) -> bool:
        """Whether ``kernel`` runs int8 (computed without autograd, module docstring)."""
        return KERNELS[self.kernel].precision == 'int8'

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        int8 = self.int8
        if not can_fuse(x, int8):
            return F.linear(x, self.weight, self.bias)
        if int8:
            refuse_int8_training(self)
        with torch.no_grad():
            out = KERNELS[self.kernel].linear(x.reshape(-1, x.shape[-1]), self)
        return out.view(*x.shape[:-1], out.shape[-1])

    def extra_repr(self) -> str:
        return (f'in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, '
                f'kernel={self.kernel}')


class FusedBlock(EngineModule, nn.Module):
    """A ``layers.Block``'s submodules (shared, same key names) run through the fused kernels in inference:
    attention's output projection with the residual accumulated by its GEMM, then the MLP a chunk of tokens at
    a time with the residual added in place, each linear layer through its own kernel (``deploy.engines.fused``
    makes them ``FusedLinear``). Position encodings inside attention (``pos``) are unaffected: fusion starts
    after attention. The region (``layers.valid``) is taken as ``layers.Block`` takes it.
    A block with layer scale is not fused (the fused engine refuses it). A block holding an int8 layer runs
    fused in eval mode with autograd on too, computed without it (module docstring)."""

    engine = 'fused'

    def __init__(self, block: nn.Module):
        super().__init__()
        self.norm1, self.attn, self.ls1, self.norm2, self.mlp, self.ls2, self.drop_path = (
            block.norm1, block.attn, block.ls1, block.norm2, block.mlp, block.ls2, block.drop_path)
        self.mlp_takes_grid = block.mlp_takes_grid
        self.train(block.training)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
                region: Region = WHOLE) -> torch.Tensor:
        if self.training or not can_fuse(x, self.int8):
            return Block.forward(self, x, hw, pos, region)
        with torch.no_grad():
            attended = self.attn.attend(self.norm1(x), hw, pos, region)
            return fused_gemms(attended.reshape(-1, attended.shape[-1]), self,
                               x.reshape(-1, x.shape[-1])).view(x.shape)

    @property
    def int8(self) -> bool:
        """Whether any of the block's linear layers runs int8."""
        return any(isinstance(m, FusedLinear) and m.int8 for m in self.modules())
