"""The CPU fast path: modules that run a block with the bias and the residual add fused into its GEMMs.

In eager PyTorch a linear layer is a GEMM plus a pass that copies the bias into the output, and GELU and the
residual add are passes of their own over activations up to 8x wider than the tokens. Here the residual is
accumulated by the GEMM itself and the MLP runs a chunk of tokens at a time, so that its wide hidden
activation is written, biased, activated and read back while it is still in cache, and is never allocated
whole: under glibc's default allocator a block that large goes back to the OS when freed, and the plain model
then pays a page fault per 4 KiB of it on every call (most of this path's lead; docs/performance.md).

Two GEMM libraries can do it, and which is faster depends on the CPU: oneDNN adds the bias and the residual in
its GEMM epilogue (and runs AVX-512 code where MKL runs AVX2 code, on AMD CPUs); MKL's ``addmm`` accumulates
into the residual (beta = 1) and biases the cached chunk in place. ``GEMMS`` names them; ``FusedBlock`` and
``FusedLinear`` take one (``models.optimize`` picks the faster by timing both on one of the model's blocks).

These modules are not part of the models: ``cpvt_backbones.models.optimize`` swaps them in for a built model's
blocks and linear layers, sharing the same parameters. They read ``weight``/``bias`` directly, so hooks on the
linear layers inside a fused block do not fire in the fused path; the plain model is the one to instrument.
The fused path runs only where it computes the same function: no autograd (and eval mode for a block),
float32 on a CPU, no autocast, and not while tracing, compiling or exporting (those record the plain ops).
Elsewhere, training included, the modules take the plain path.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .block import Block
from .layout import symbolic_shapes
from .position.base import AttentionPosition

# Tokens per chunk of the fused MLP: the chunk's hidden activation (4-16 MiB of float32) stays in cache
# between the two GEMMs and the GELU instead of going out to memory and back (2048 measured best of 512-8192).
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


def can_fuse(x: torch.Tensor) -> bool:
    """Whether the fused kernels may replace the plain ops for ``x`` (see the module docstring)."""
    return (not torch.is_grad_enabled() and x.device.type == 'cpu' and x.dtype == torch.float32
            and not torch.is_autocast_enabled('cpu') and not symbolic_shapes())


def _onednn(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """``layer(x)`` on 2-D ``x`` in one oneDNN call, the bias added in the GEMM."""
    return _LINEAR(x, layer.weight, layer.bias, 'none', [], '')


def _mkl(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """``layer(x)`` on 2-D ``x`` through MKL's ``addmm`` (the bias copied into the output first)."""
    return x @ layer.weight.t() if layer.bias is None else torch.addmm(layer.bias, x, layer.weight.t())


def _onednn_residual(x: torch.Tensor, layer: nn.Module, other: torch.Tensor) -> torch.Tensor:
    """``layer(x) + other`` on 2-D tensors in one oneDNN call."""
    return _LINEAR.binary(x, other, layer.weight, layer.bias, 'add')


def _mkl_residual(x: torch.Tensor, layer: nn.Module, other: torch.Tensor) -> torch.Tensor:
    """``layer(x) + other`` on 2-D tensors: MKL accumulates the product into a copy of ``other``."""
    out = torch.addmm(other, x, layer.weight.t())
    return out if layer.bias is None else out.add_(layer.bias)


_LINEARS = {'onednn': _onednn, 'mkl': _mkl}
_RESIDUALS = {'onednn': _onednn_residual, 'mkl': _mkl_residual}
GEMMS = tuple(g for g in ('mkl', 'onednn') if g == 'mkl' or _LINEAR is not None)


def check_gemm(gemm: str) -> str:
    """``gemm`` if it names a library this torch build has, else a clear error."""
    if gemm not in ('mkl', 'onednn'):
        raise ValueError(f"gemm must be 'mkl' or 'onednn', got {gemm!r}")
    if gemm not in GEMMS:
        raise RuntimeError("gemm='onednn' needs oneDNN (torch.backends.mkldnn), which this torch build lacks")
    return gemm


def fused_mlp(part: torch.Tensor, norm: nn.Module, fc1: nn.Module, fc2: nn.Module, gemm: str) -> None:
    """``part += fc2(gelu(fc1(norm(part))))`` on a 2-D chunk of tokens, in place."""
    hidden = torch.ops.aten.gelu_(_LINEARS[gemm](norm(part), fc1))
    if gemm == 'onednn':
        part += _onednn(hidden, fc2)
    else:
        if fc2.bias is not None:
            part += fc2.bias
        part.addmm_(hidden, fc2.weight.t())


def fused_gemms(attended: torch.Tensor, block: nn.Module, gemm: str, residual: torch.Tensor) -> torch.Tensor:
    """What follows attention in a block, on 2-D tokens: ``x = residual + proj(attended)``, then
    ``x += mlp(norm2(x))`` a chunk at a time."""
    flat = _RESIDUALS[gemm](attended, block.attn.proj, residual)
    for start in range(0, flat.shape[0], MLP_CHUNK_TOKENS):
        fused_mlp(flat[start:start + MLP_CHUNK_TOKENS], block.norm2, block.mlp.fc1, block.mlp.fc2, gemm)
    return flat


class FusedLinear(nn.Module):
    """An ``nn.Linear``'s parameters (shared, same key names) applied through ``gemm`` where ``can_fuse``
    allows, else with ``F.linear``."""

    def __init__(self, layer: nn.Linear, gemm: str = 'onednn'):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.gemm = check_gemm(gemm)
        self.weight = layer.weight
        self.bias = layer.bias
        self.train(layer.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not can_fuse(x):
            return F.linear(x, self.weight, self.bias)
        out = _LINEARS[self.gemm](x.reshape(-1, x.shape[-1]), self)
        return out.view(*x.shape[:-1], out.shape[-1])

    def extra_repr(self) -> str:
        return (f'in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, '
                f'gemm={self.gemm}')


class FusedBlock(nn.Module):
    """A ``layers.Block``'s submodules (shared, same key names) run through the fused kernels in inference:
    attention's output projection with the residual accumulated by its GEMM, then the MLP a chunk of tokens at
    a time with the residual added in place. Position encodings inside attention (``pos``) are unaffected:
    fusion starts after attention. A block with layer scale is not fused (``models.optimize`` refuses it)."""

    def __init__(self, block: nn.Module, gemm: str = 'onednn'):
        super().__init__()
        self.gemm = check_gemm(gemm)
        self.norm1, self.attn, self.ls1, self.norm2, self.mlp, self.ls2, self.drop_path = (
            block.norm1, block.attn, block.ls1, block.norm2, block.mlp, block.ls2, block.drop_path)
        self.train(block.training)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int], pos: Optional[AttentionPosition] = None
                ) -> torch.Tensor:
        if self.training or not can_fuse(x):
            return Block.forward(self, x, hw, pos)
        attended = self.attn.attend(self.norm1(x), hw, pos)
        return fused_gemms(attended.reshape(-1, attended.shape[-1]), self, self.gemm, x.reshape(-1, x.shape[-1])
                           ).view(x.shape)

    def extra_repr(self) -> str:
        return f'gemm={self.gemm}'
