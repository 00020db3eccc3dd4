"""The fused engine's modules: a block with the bias and the residual add fused into its GEMMs and the MLP run
``MLP_CHUNK_TOKENS`` tokens at a time (its hidden activation never allocated whole), in float32 or int8.

A ``Kernel`` runs a linear layer's GEMM on 2-D float32 tokens (``KERNELS``): ``mkl`` and ``onednn`` in float32,
``onednn_int8`` in static int8 (``OneDNNInt8``; activation ranges from calibration, ``FusedLinear.input_range``).

The fused engine (``deploy.engines.fused``) swaps ``FusedBlock`` and ``FusedLinear`` in for a built model's
blocks and linear layers, sharing its parameters and key names (what a kernel derives is not in the state dict).
They read ``weight``/``bias`` directly: hooks on the linear layers inside a fused block do not fire. The fused
path runs where ``can_fuse`` allows, at float32 only with autograd off (and, for a block, in eval mode);
elsewhere the modules take the plain float32 path, with the same outputs and gradients. int8 runs int8 with
autograd on or off, same outputs, computed without autograd (no gradient reaches inputs or weights); in
training mode with autograd on it raises a RuntimeError (``refuse_int8_training``).
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
    """Whether the fused kernels may replace the plain ops for ``x``: float32 on a CPU, no autocast, no graph
    being recorded (tracing, compiling, exporting), and autograd off unless ``int8``."""
    return ((int8 or not torch.is_grad_enabled()) and x.device.type == 'cpu' and x.dtype == torch.float32
            and not autocast_enabled('cpu') and not symbolic_shapes())


def refuse_int8_training(module: nn.Module) -> None:
    """A RuntimeError naming ``module`` (holding int8 layers) where it is in training mode with autograd on."""
    if module.training and torch.is_grad_enabled():
        raise RuntimeError(f'{type(module).__name__} runs static int8, which does not backpropagate (its int8 GEMMs '
                           'have no gradient) and so does not train: train the float32 model (or prepare it with '
                           "precision='fp32'), call eval() for inference, or run under torch.no_grad()")


class Kernel:
    """How a linear layer's GEMM runs on 2-D float32 tokens: ``pack`` derives what the kernel needs from the
    layer once (None: the layer's own parameters), ``linear`` returns ``layer(x)``, ``residual`` returns
    ``other + layer(x)`` and ``accumulate`` adds ``layer(x)`` to ``part`` in place. The base class composes them
    from ``linear``; subclasses fuse them into the GEMM."""
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
    AMX) or whose flags are unknown, 127 elsewhere (PyTorch's x86 ``reduce_range``); computed once."""
    # Without VNNI oneDNN's AVX2 kernel adds pairs of u8 x s8 products in saturating 16-bit arithmetic, which
    # 8-bit activations can overflow.
    flags = cpu_flags()
    return 255 if not flags or flags & {'avx512_vnni', 'avx_vnni', 'amx_int8'} else 127


def uint8_qparams(low: float, high: float) -> tuple[float, int]:
    """Scale and zero point mapping [low, high] (widened to include 0, which maps exactly) onto the uint8 codes
    0..``activation_qmax()``."""
    qmax = activation_qmax()
    low, high = min(low, 0.), max(high, 0.)
    scale = max(high - low, 1e-8) / qmax
    return scale, int(min(qmax, max(0, round(-low / scale))))


@functools.lru_cache(maxsize=4096)
def _float32_inverse(scale: float) -> float:
    """1 / ``scale`` computed in float32, as torch's quantizer computes it (cached)."""
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
        """float32 ``x`` to uint8 codes: round(x / scale) + zero_point (ties to even), saturated at 0 and
        ``activation_qmax()``; the codes of torch's ``quantize_per_tensor``."""
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
    """``name`` where it names a kernel this torch build and CPU can run; a ValueError for an unknown name, a
    RuntimeError saying why where it cannot run here."""
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
    """What follows attention in a block, on 2-D tokens: returns ``x = residual + proj(attended)`` after
    ``x += mlp(norm2(x))`` a chunk at a time; each layer through its own kernel unless ``kernel`` names one (a
    float32 one also runs a plain block's ``nn.Linear`` layers)."""
    proj = block.attn.proj
    flat = KERNELS[kernel or proj.kernel].residual(attended, proj, residual)
    for start in range(0, flat.shape[0], MLP_CHUNK_TOKENS):
        fused_mlp(flat[start:start + MLP_CHUNK_TOKENS], block.norm2, block.mlp.fc1, block.mlp.fc2, kernel)
    return flat


class FusedLinear(EngineModule, nn.Module):
    """``layer``'s parameters (shared, same key names) applied through ``kernel`` (``check_kernel``) where
    ``can_fuse`` allows, else with ``F.linear``. ``packed`` (what the kernel derives from the weights and
    ``input_range``) is not in the state dict and is derived again whenever the weight, bias or range changes,
    so a checkpoint loaded after ``prepare`` takes effect."""

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
        """Copies and pickles leave out what the kernel derived; it is derived again on first use."""
        # oneDNN's packed weights cannot be copied
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
    """``block``'s submodules (shared, same key names) with ``layers.Block``'s call: in eval mode where
    ``can_fuse`` allows, attention as it is, then ``fused_gemms``; else ``layers.Block.forward``. A block holding
    an int8 layer is fused with autograd on too, computed without it. Layer scale is not fused (the fused engine
    refuses such a block)."""

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
