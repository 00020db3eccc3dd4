"""The CPU fast path: oneDNN GEMMs that fuse a linear layer's bias (training too) or residual add (inference).

In eager PyTorch a linear layer is a GEMM plus a pass that copies the bias into the output, and GELU and the
residual add are passes of their own over activations up to 8x wider than the tokens; on a CPU those passes
cost as much as a third of a PCPVT forward. oneDNN (the library torch.compile's CPU backend fuses into) adds
the bias and the residual in the GEMM's epilogue, and the MLP runs a chunk of tokens at a time so that its
wide hidden activation is written, activated and read back while it is still in cache. The models take this
path only where it computes the same function: eval mode, no autograd, float32 on a CPU, no autocast, and not
while tracing, compiling or exporting (those see the plain ops and fuse on their own). Training keeps only the
bias fusion (``linear``, an autograd function whose backward is the usual two GEMMs and a bias sum),
which saves the pass that ``addmm`` spends copying the bias into every output row.
"""
import torch
import torch.nn.functional as F
from torch import nn


def _onednn_linear():
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_LINEAR = _onednn_linear()


def _is_compiling() -> bool:
    compiler = getattr(torch, 'compiler', None)
    if compiler is not None and hasattr(compiler, 'is_compiling'):
        return compiler.is_compiling()
    return torch._dynamo.is_compiling()  # torch < 2.3


def symbolic_shapes() -> bool:
    """True while torch.compile, torch.export, ONNX export or TorchScript tracing records the model: then
    shape-dependent Python branches would be baked into (or guard) the recorded graph."""
    return _is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def _autocast_cpu() -> bool:
    try:
        return torch.is_autocast_enabled('cpu')
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def can_fuse_linear(x: torch.Tensor) -> bool:
    """Whether the bias-fused ``linear`` may replace ``F.linear`` for ``x`` (any mode, autograd allowed)."""
    return (_LINEAR is not None and x.device.type == 'cpu' and x.dtype == torch.float32 and not _autocast_cpu()
            and not symbolic_shapes())


def use_fused(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` may run ``x`` through all the fused inference kernels (see the module docstring)."""
    return not module.training and not torch.is_grad_enabled() and can_fuse_linear(x)


class _BiasFusedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _LINEAR(x, weight, bias, 'none', [], '')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        return (grad @ weight if need_x else None, grad.t() @ x if need_w else None,
                grad.sum(0) if need_b and ctx.has_bias else None)


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)`` in one oneDNN call, the bias added in the GEMM; differentiable. (oneDNN's GELU epilogue is
    slower on AVX2 than torch's own in-place GELU over the cache-resident result, so activations stay outside.)"""
    out = _BiasFusedLinear.apply(x.reshape(-1, x.shape[-1]), layer.weight, layer.bias)
    return out.view(*x.shape[:-1], out.shape[-1])


def linear_add(x: torch.Tensor, layer: nn.Linear, other: torch.Tensor) -> torch.Tensor:
    """``layer(x) + other`` in one oneDNN call (a residual connection)."""
    out = _LINEAR.binary(x.reshape(-1, x.shape[-1]), other.reshape(-1, other.shape[-1]), layer.weight, layer.bias,
                         'add')
    return out.view(other.shape)


def plain_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def any_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)``: bias-fused where ``can_fuse_linear`` allows, else ``F.linear``."""
    return (linear if can_fuse_linear(x) else plain_linear)(x, layer)
