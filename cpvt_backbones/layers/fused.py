"""The CPU fast path: modules that run a block through oneDNN GEMMs with the bias and the residual add fused.

In eager PyTorch a linear layer is a GEMM plus a pass that copies the bias into the output, and GELU and the
residual add are passes of their own over activations up to 8x wider than the tokens; on a CPU those passes
cost as much as a third of a PCPVT forward. oneDNN adds the bias and the residual in the GEMM's epilogue, and
the MLP runs a chunk of tokens at a time so that its wide hidden activation is written, activated and read
back while it is still in cache.

These modules are not part of the models: ``cpvt_backbones.models.optimize`` swaps them in for a built model's
blocks and linear layers, sharing the same parameters. They read ``weight``/``bias`` directly, so hooks on the
linear layers inside a fused block do not fire in the fused path; the plain model is the one to instrument.
The fused path runs only where it computes the same function: eval mode, no autograd, float32 on a CPU, no
autocast, and not while tracing, compiling or exporting (those record the plain ops). Elsewhere the modules
take the plain path, except that ``FusedLinear`` also adds its bias in the GEMM under autograd (its backward
is the usual two GEMMs and a bias sum).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .layout import symbolic_shapes

# Tokens per chunk of the fused MLP: the chunk's hidden activation (4-16 MiB of float32) stays in cache
# between the two GEMMs and the GELU instead of going out to memory and back (2048 measured best of 1024-8192).
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


def can_fuse_linear(x: torch.Tensor) -> bool:
    """Whether the bias-fused GEMM may replace ``F.linear`` for ``x`` (any mode, autograd allowed)."""
    return (_LINEAR is not None and x.device.type == 'cpu' and x.dtype == torch.float32
            and not torch.is_autocast_enabled('cpu') and not symbolic_shapes())


class _BiasFusedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _LINEAR(x, weight, bias, 'none', [], '')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        return (grad @ weight if need_x else None, grad.t() @ x if need_w else None,
                grad.sum(0) if need_b and ctx.has_bias else None)


def _linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    out = _BiasFusedLinear.apply(x.reshape(-1, x.shape[-1]), layer.weight, layer.bias)
    return out.view(*x.shape[:-1], out.shape[-1])


def _linear_add(x: torch.Tensor, layer: nn.Module, other: torch.Tensor) -> torch.Tensor:
    """``layer(x) + other`` in one oneDNN call (a residual connection)."""
    out = _LINEAR.binary(x.reshape(-1, x.shape[-1]), other.reshape(-1, other.shape[-1]), layer.weight, layer.bias,
                         'add')
    return out.view(other.shape)


class FusedLinear(nn.Module):
    """An ``nn.Linear``'s parameters (shared, same key names) applied with the bias added inside the GEMM
    where ``can_fuse_linear`` allows, else with ``F.linear``."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight = layer.weight
        self.bias = layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self) if can_fuse_linear(x) else F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f'in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}'


class FusedBlock(nn.Module):
    """A ``layers.Block``'s submodules (shared, same key names) run through the fused kernels in inference:
    attention's output projection with the residual add in its GEMM, then the MLP a chunk of tokens at a time
    with the residual added in place."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp, self.drop_path = (
            block.norm1, block.attn, block.norm2, block.mlp, block.drop_path)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        if self.training or torch.is_grad_enabled() or not can_fuse_linear(x):
            x = x + self.drop_path(self.attn(self.norm1(x), hw))
            return x + self.drop_path(self.mlp(self.norm2(x)))
        x = _linear_add(self.attn.attend(self.norm1(x), hw), self.attn.proj, x)
        flat = x.view(-1, x.shape[-1])
        for start in range(0, flat.shape[0], MLP_CHUNK_TOKENS):
            part = flat[start:start + MLP_CHUNK_TOKENS]
            part += _linear(torch.ops.aten.gelu_(_linear(self.norm2(part), self.mlp.fc1)), self.mlp.fc2)
        return x
