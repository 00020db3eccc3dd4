"""What differs between the torch releases the package supports (2.1 to 2.15), in one place.

The forward path uses only what torch 2.1 has, through the helpers below; features built on newer APIs
(export-based ONNX and OpenVINO conversion, the static-int8 oneDNN kernel) check ``require`` when called and
name the feature and the release it needs. Nothing here changes torch's state.
"""
import sys

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils import flop_counter


def torch_at_least(release: str) -> bool:
    """Whether this torch's (major, minor) is at least ``release`` ('2.14'), for what no API tells."""
    have = tuple(int(''.join(c for c in n if c.isdigit()) or 0) for n in torch.__version__.split('+')[0].split('.')[:2])
    return have >= tuple(int(n) for n in release.split('.'))


def _export_dims() -> bool:
    export = getattr(torch, 'export', None)
    return hasattr(getattr(export, 'Dim', None), 'DYNAMIC')


def _int8_linear() -> bool:
    ops = torch.ops.onednn
    return (hasattr(ops, 'qlinear_pointwise') and 'binary' in ops.qlinear_pointwise.overloads()
            and 'output_dtype' in str(ops.qlinear_pointwise.default._schema)
            and 'Tensor? other, Tensor? bias' in str(ops.qlinear_pointwise.binary._schema))


class _ArangeOfWidth(nn.Module):
    def forward(self, x):
        return torch.arange(x.shape[-1], device=x.device)


def _fx_sizes() -> bool:
    try:
        torch.fx.symbolic_trace(_ArangeOfWidth())
    except TypeError:  # torch 2.1: a factory function refuses a size that is a torch.fx Proxy
        return False
    return True


# Each feature built on a newer torch API: the release that brought the API (for messages), what it is, and
# whether this torch has it (a test of the API itself, not of the version number).
FEATURES = {
    'export': ('2.6', 'torch.export with Dim.DYNAMIC, for ONNX (dynamo) and OpenVINO conversion', _export_dims),
    'int8_kernel': ('2.5', "oneDNN's quantized linear with output_dtype and a .binary overload taking the "
                           'summand before the bias (onednn::qlinear_pointwise)', _int8_linear),
    'flop_formulas': ('2.2', "torch.utils.flop_counter.register_flop_formula and its SDPA formulas",
                      lambda: hasattr(flop_counter, 'register_flop_formula')),
    # No API tells this one: dynamo of torch 2.1 recompiles for a second input size.
    'one_graph_compile': ('2.14', 'torch.compile(dynamic=True) tracing one graph for every input size',
                          lambda: torch_at_least('2.14')),
    'safe_globals': ('2.5', 'torch.serialization.safe_globals, extra allowed globals for weights_only loading',
                     lambda: hasattr(torch.serialization, 'safe_globals')),
    # Verified on 2.14 and 2.15 (2.1 refuses; the releases between were not checked).
    'fx_sizes': ('2.14', 'torch.fx symbolic tracing of factory calls sized by the input (torch.arange(x.shape[-1])), '
                         'which the sin-cos, RPE and RoPE encodings make', _fx_sizes),
}


def supports(feature: str) -> bool:
    """Whether this torch has what ``feature`` (a key of ``FEATURES``) needs."""
    return FEATURES[feature][2]()


def require(feature: str, use: str) -> None:
    """Raise a RuntimeError naming ``use`` (what the caller was asked to do) and the torch it needs when this
    torch lacks ``feature``."""
    if not supports(feature):
        release, what = FEATURES[feature][:2]
        raise RuntimeError(f'{use} needs torch >= {release} ({what}); this is torch {torch.__version__}')


def is_compiling() -> bool:
    """True while torch.compile or torch.export traces the model (``torch.compiler.is_compiling`` from torch
    2.3; before that ``torch._utils.is_compiling``, which dynamo folds to True while tracing)."""
    compiler = getattr(torch, 'compiler', None)
    if compiler is not None and hasattr(compiler, 'is_compiling'):
        return compiler.is_compiling()
    return torch._utils.is_compiling()


def is_fx_tracing() -> bool:
    """True while ``torch.fx.symbolic_trace`` (timm's ``feature_cls='fx'``, torchvision's
    ``create_feature_extractor``) traces the model: its inputs are then ``torch.fx.Proxy`` objects, not tensors.
    False under torch.compile and torch.export (whose dynamo cannot trace this check on torch 2.1)."""
    if is_compiling():
        return False
    from torch.fx import _symbolic_trace as fx_trace  # is_fx_symbolic_tracing from torch 2.6 (is_fx_tracing warns)
    return getattr(fx_trace, 'is_fx_symbolic_tracing', fx_trace.is_fx_tracing)()


def is_in_onnx_export() -> bool:
    """True during ``torch.onnx.export``. Reads ``torch.onnx`` only when something has imported it already (no
    export can run otherwise): importing it on a forward pass pulls in the ONNX stack on some releases."""
    onnx = sys.modules.get('torch.onnx')
    return onnx is not None and onnx.is_in_onnx_export()


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ('cpu' or 'cuda')."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_cpu_enabled() if device_type == 'cpu' else torch.is_autocast_enabled()


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule at dotted path ``name`` (``nn.Module.set_submodule`` exists from torch 2.5)."""
    parent, _, leaf = name.rpartition('.')
    owner = model.get_submodule(parent) if parent else model
    if not hasattr(owner, leaf):
        raise AttributeError(f'{type(owner).__name__} has no submodule {leaf!r} (path {name!r})')
    setattr(owner, leaf, module)


def tree_leaves(tree) -> list:
    """The leaves of a pytree (``pytree.tree_leaves`` exists from torch 2.2)."""
    return pytree.tree_flatten(tree)[0]


__all__ = ['FEATURES', 'autocast_enabled', 'is_compiling', 'is_fx_tracing', 'is_in_onnx_export', 'require',
           'set_submodule', 'supports', 'torch_at_least', 'tree_leaves']
