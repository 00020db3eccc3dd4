"""The fused engine (``prepare(model, 'fused', precision)``): this package's CPU kernels swapped into a copy of a
built model, in float32 or int8.

The engine swaps each transformer block for a ``deploy.kernels.FusedBlock`` and each linear layer for a
``deploy.kernels.FusedLinear`` sharing the copy's parameters: the state dict is unchanged. In float32 the outputs
agree with the plain model to float32 rounding; ``precision='int8'`` runs the linear layers' GEMMs on int8 copies
of their weights (the float32 parameters stay as they are). bf16 is not a fused precision (the torch engine's
is). Position encodings are kept as they are. It refuses, naming why, a model it cannot fuse faithfully (wrapped
or hooked layers, layer scale) and a precision the CPU cannot run.
"""
import contextlib
import copy
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from ...compat import set_submodule
from ...layers import Block, LocallyGroupedAttention, Mlp
from ..kernels import GEMMS, KERNELS, FusedBlock, FusedLinear, check_kernel, fused_gemms, unavailable_reason
from ..registry import Engine, register, under

_BLOCK_LAYERS = {'norm1': nn.LayerNorm, 'norm2': nn.LayerNorm, 'attn.q': nn.Linear, 'attn.kv': nn.Linear,
                 'attn.proj': nn.Linear, 'mlp.fc1': nn.Linear, 'mlp.act': nn.GELU, 'mlp.fc2': nn.Linear,
                 'ls1': nn.Identity, 'ls2': nn.Identity}
# A windowed block (Twins-SVT's LocallyGroupedAttention) projects queries, keys and values with one layer, attn.qkv.
_WINDOWED_BLOCK_LAYERS = {**{p: k for p, k in _BLOCK_LAYERS.items() if p not in ('attn.q', 'attn.kv')},
                          'attn.qkv': nn.Linear}


def _check_block(name: str, block: Block) -> None:
    windowed = isinstance(block.attn, LocallyGroupedAttention)
    for path, kind in (_WINDOWED_BLOCK_LAYERS if windowed else _BLOCK_LAYERS).items():
        layer = block.get_submodule(path)
        if type(layer) is not kind:
            if path.startswith('ls'):
                raise ValueError(f'engine fused: {name}.{path} is a {type(layer).__name__} (layer_scale_init); the '
                                 'fused kernels add the residual branches unscaled, so a layer-scaled model is not '
                                 'fused')
            raise ValueError(f'engine fused: {name}.{path} is a {type(layer).__name__}, not a plain {kind.__name__}; '
                             'the fused kernels read its parameters directly and would bypass it '
                             '(apply wrappers such as LoRA to the prepared model, or use another engine)')
    if type(block.mlp) is not Mlp:
        raise ValueError(f'engine fused: {name}.mlp is a {type(block.mlp).__name__}, not a plain Mlp; the fused MLP '
                         'computes fc2(act(fc1(x))) and would skip the rest of it (a ConvMlp\'s convolution)')
    if block.mlp.act.approximate != 'none':
        raise ValueError(f"engine fused: {name}.mlp.act uses approximate={block.mlp.act.approximate!r}; the fused "
                         "MLP computes the exact GELU")
    for sub_name, sub in block.named_modules(prefix=name):
        if sub._forward_hooks or sub._forward_pre_hooks:
            raise ValueError(f'engine fused: {sub_name} has forward hooks, which the fused kernels would not call; '
                             'register them on the prepared model\'s blocks, or instrument the plain model')


def pick_gemm(block: Block, tokens: int = 1024, repeats: int = 7) -> str:
    """The GEMM library (``deploy.kernels.GEMMS``) that runs ``block``'s fused GEMMs faster on this machine: the
    output projection with its residual and the MLP on ``tokens`` random tokens with each library, interleaved
    ``repeats`` times after two warm-up rounds; the lower median wins (well under a second)."""
    if len(GEMMS) == 1:
        return GEMMS[0]
    x = torch.randn(tokens, block.mlp.fc1.in_features)
    times = {g: [] for g in GEMMS}
    with torch.no_grad():
        for _ in range(repeats + 2):
            for gemm in GEMMS:
                start = time.perf_counter()
                fused_gemms(x, block, x, kernel=gemm)
                times[gemm].append(time.perf_counter() - start)
    return min(GEMMS, key=lambda g: sorted(times[g][2:])[repeats // 2])


# The kernel each precision runs its linear layers through (float32: the faster of ``GEMMS``, timed).
PRECISION_KERNELS = {'fp32': None, 'int8': 'onednn_int8'}


@contextlib.contextmanager
def record_input_ranges(model: nn.Module) -> Iterator[dict[str, tuple[float, float]]]:
    """Calibration for static int8: while the ``with`` block runs ``model`` (or a detector around it) on
    representative inputs, the dict it yields collects the (min, max) of every linear layer's input, by name
    in ``model``; pass it to ``prepare(model, 'fused', 'int8', input_ranges=...)``. Run the plain model (a
    prepared one's fused path calls no linear layer)."""
    ranges: dict[str, tuple[float, float]] = {}

    def observe(name):
        def hook(module, args):
            low, high = torch.aminmax(args[0].detach())
            old = ranges.get(name, (float('inf'), float('-inf')))
            ranges[name] = (min(old[0], low.item()), max(old[1], high.item()))
        return hook

    handles = [m.register_forward_pre_hook(observe(name)) for name, m in model.named_modules()
               if isinstance(m, (nn.Linear, FusedLinear))]
    try:
        with torch.no_grad():
            yield ranges
    finally:
        for handle in handles:
            handle.remove()


def calibrated_ranges(model: nn.Module, calibration, cache) -> dict[str, list[float]]:
    """The input ranges of ``model``'s linear layers: those saved in ``cache``'s artifact where it holds for this
    model and request (the same calibration batches), else recorded over ``calibration`` (a
    ``registry.Calibration``, ``record_input_ranges``) and saved there."""
    artifact = cache.result('.ranges.json')
    path = artifact.load() if artifact is not None else None
    if path is not None:
        return json.loads(path.read_text())
    with record_input_ranges(model) as ranges:
        for batch in calibration:
            model(batch)
    if artifact is not None:
        artifact.save(lambda target: target.write_text(json.dumps(ranges, indent=1)))
    return ranges


def _input_ranges(value) -> Mapping[str, Sequence[float]]:
    """The ranges of the option ``input_ranges``: a mapping, or the path of a JSON file holding one (a saved
    artifact of this engine, ``adapters.engines.calibrate``)."""
    return json.loads(Path(value).read_text()) if isinstance(value, (str, Path)) else value


def _validate(precision: str, options: Mapping[str, object]) -> None:
    gemm = options.get('gemm', 'auto')
    if gemm != 'auto' and gemm not in GEMMS:
        raise ValueError(f'engine fused: gemm must be one of {list(GEMMS)} (or auto), got {gemm!r}')
    if options.get('input_ranges') is not None and precision != 'int8':
        raise ValueError(f'engine fused: input_ranges calibrate int8; precision={precision!r} does not use them')


def _prepare(model: nn.Module, request, calibration, cache) -> nn.Module:
    """A copy of ``model`` with the fused CPU modules swapped in (module docstring), at ``request.precision``
    ('fp32', or 'int8' at the input ranges of the option ``input_ranges`` or else calibrated, ``calibrated_ranges``;
    the linear layers under ``request.keep_fp32`` in float32), through the GEMM library of the option ``gemm``
    ('mkl', 'onednn', or 'auto': ``pick_gemm``)."""
    precision, keep = request.precision, tuple(request.keep_fp32)
    low = PRECISION_KERNELS[precision]
    if low is not None and not KERNELS[low].available():
        raise RuntimeError(f"engine fused: precision={precision!r} cannot run here: {unavailable_reason(low)} "
                           f"(torch reports CPU capability {torch.backends.cpu.get_cpu_capability()})")
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.device.type != 'cpu' or tensor.dtype != torch.float32:
            raise ValueError(f'engine fused works on a float32 CPU model; {name} is {tensor.dtype} on {tensor.device}')
    blocks = [(name, m) for name, m in model.named_modules() if type(m) is Block]
    if not blocks:
        raise ValueError(f'engine fused: {type(model).__name__} has no cpvt_backbones transformer block to fuse')
    for name, block in blocks:
        _check_block(name, block)
    input_ranges = None
    if precision == 'int8':
        given = request.options.get('input_ranges')
        input_ranges = _input_ranges(given) if given is not None else calibrated_ranges(model, calibration, cache)
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    if input_ranges is not None:
        missing = [n for n, _ in linears if n not in input_ranges and not under(n, keep)]
        if missing:
            raise ValueError(f'engine fused: input_ranges has no range for {len(missing)} linear layer(s) '
                             f'({", ".join(missing[:4])}{" ..." if len(missing) > 4 else ""}); calibrate this '
                             'model, or keep those layers in float32 (keep_fp32)')
    model = copy.deepcopy(model)
    gemm = request.options.get('gemm', 'auto')
    if gemm == 'auto':  # timed on a block of median width: the narrow first stage's is too close to call
        widths = sorted((b for _, b in blocks), key=lambda b: b.mlp.fc1.in_features)
        gemm = pick_gemm(widths[len(widths) // 2])
    for name, _ in blocks:
        set_submodule(model, name, FusedBlock(model.get_submodule(name)))
    for name, _ in linears:
        kernel = gemm if low is None or under(name, keep) else low
        fused = FusedLinear(model.get_submodule(name), check_kernel(kernel))
        if kernel == 'onednn_int8':
            fused.input_range = tuple(float(v) for v in input_ranges[name])
        set_submodule(model, name, fused)
    return model


register(Engine(
    'fused', 'backbone', {'fp32': 'everything (same outputs to float32 rounding)',
                          'int8': 'all but the linear layers (norms, attention products and softmax, convolutions), '
                                  'linear layers in keep_fp32; the rest of the model'},
    _prepare, "this package's fused CPU kernels for our transformer blocks (deploy.engines.fused); int8: static, "
              'activations at ranges calibrated on input batches',
    calibrated=('int8',), options=('gemm', 'input_ranges'), validate=_validate, calibration_option='input_ranges',
    trains=('fp32',), bucketing={}, run_options=('gemm',)))

__all__ = ['PRECISION_KERNELS', 'calibrated_ranges', 'pick_gemm', 'record_input_ranges']
