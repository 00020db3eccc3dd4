"""The CPU fast path: modules that run a block through oneDNN GEMMs with the bias and the residual add fused.

In eager PyTorch a linear layer is a GEMM plus a pass that copies the bias into the output, and GELU and the
residual add are passes of their own over activations up to 8x wider than the tokens; on a CPU those passes
cost as much as a third of a PCPVT forward. oneDNN adds the bias and the residual in the GEMM's epilogue, and
the MLP runs a chunk of tokens at a time so that its wide hidden activation is written, activated and read
back while it is still in cache.

These modules are not part of the models: ``cpvt_backbones.models.optimize`` swaps them in for a built model's
blocks and linear layers, sharing the same parameters. They read ``weight``/``bias`` directly, so hooks on the
linear layers inside a fused block do not fire in the fused path; the plain model is the one to instrument.
The fused path runs only where it computes the same function: no autograd (and eval mode for a block),
float32 on a CPU, no autocast, and not while tracing, compiling or exporting (those record the plain ops).
Elsewhere, training included, the modules take the plain path. (A bias-fused GEMM with its own backward was
measured for training: 2.8% faster per step, with a round-to-round spread of 3%, so it is not used.)
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .block import Block
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


def can_fuse(x: torch.Tensor) -> bool:
    """Whether the fused kernels may replace the plain ops for ``x`` (see the module docstring)."""
    return (_LINEAR is not None and not torch.is_grad_enabled() and x.device.type == 'cpu'
            and x.dtype == torch.float32 and not torch.is_autocast_enabled('cpu') and not symbolic_shapes())


def _linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """``layer(x)`` in one oneDNN call, the bias added in the GEMM."""
    out = _LINEAR(x.reshape(-1, x.shape[-1]), layer.weight, layer.bias, 'none', [], '')
    return out.view(*x.shape[:-1], out.shape[-1])


def _linear_add(x: torch.Tensor, layer: nn.Module, other: torch.Tensor) -> torch.Tensor:
    """``layer(x) + other`` in one oneDNN call (a residual connection)."""
    out = _LINEAR.binary(x.reshape(-1, x.shape[-1]), other.reshape(-1, other.shape[-1]), layer.weight, layer.bias,
                         'add')
    return out.view(other.shape)


class FusedLinear(nn.Module):
    """An ``nn.Linear``'s parameters (shared, same key names) applied with the bias added inside the GEMM
    where ``can_fuse`` allows, else with ``F.linear``."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight = layer.weight
        self.bias = layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self) if can_fuse(x) else F.linear(x, self.weight, self.bias)

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
        if self.training or not can_fuse(x):
            return Block.forward(self, x, hw)
        x = _linear_add(self.attn.attend(self.norm1(x), hw), self.attn.proj, x)
        flat = x.view(-1, x.shape[-1])
        for start in range(0, flat.shape[0], MLP_CHUNK_TOKENS):
            part = flat[start:start + MLP_CHUNK_TOKENS]
            part += _linear(torch.ops.aten.gelu_(_linear(self.norm2(part), self.mlp.fc1)), self.mlp.fc2)
        return x
