"""``optimize(model)``: the fused engine (``deploy.ENGINES['fused']``), an explicit transform of a built model, in
float32 or int8.

The models themselves only call their submodules (hooks, wrappers, quantisation and FLOP counters see every
layer) and know nothing of precision. For CPU inference, ``optimize`` swaps each transformer block for a
``deploy.fused.FusedBlock`` and each linear layer for a ``deploy.fused.FusedLinear`` that share the block's
parameters: the state dict is unchanged. In float32 the outputs agree with the plain model to float32 rounding;
``precision='int8'`` runs the linear layers' GEMMs on int8 copies of their weights (``deploy.fused.KERNELS``; the
float32 parameters stay as they are, for the plain path and the state dict). bf16 is not a fused precision: the
torch engine's bf16 runs the plain model under autocast (``deploy.to_autocast``; docs/performance.md compares
them). Every position encoding is kept as it is (they act before a block's fused part: on the tokens, or inside
attention). It refuses a model it cannot fuse faithfully (wrapped or hooked layers, layer scale) and a
precision the CPU cannot run, and names why.
"""
import contextlib
import copy
import json
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from ..compat import set_submodule
from ..layers import Block, LocallyGroupedAttention, Mlp
from ..utils import atomic_write
from .fused import GEMMS, KERNELS, FusedBlock, FusedLinear, check_kernel, fused_gemms, unavailable_reason
from .precision import check_precision

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
                raise ValueError(f'optimize: {name}.{path} is a {type(layer).__name__} (layer_scale_init); the fused '
                                 'kernels add the residual branches unscaled, so a layer-scaled model is not fused')
            raise ValueError(f'optimize: {name}.{path} is a {type(layer).__name__}, not a plain {kind.__name__}; '
                             'the fused kernels read its parameters directly and would bypass it '
                             '(apply wrappers such as LoRA after optimize, or do not optimize)')
    if type(block.mlp) is not Mlp:
        raise ValueError(f'optimize: {name}.mlp is a {type(block.mlp).__name__}, not a plain Mlp; the fused MLP '
                         'computes fc2(act(fc1(x))) and would skip the rest of it (a ConvMlp\'s convolution)')
    if block.mlp.act.approximate != 'none':
        raise ValueError(f"optimize: {name}.mlp.act uses approximate={block.mlp.act.approximate!r}; the fused "
                         "MLP computes the exact GELU")
    for sub_name, sub in block.named_modules(prefix=name):
        if sub._forward_hooks or sub._forward_pre_hooks:
            raise ValueError(f'optimize: {sub_name} has forward hooks, which the fused kernels would not call; '
                             'register them on the optimized model\'s blocks, or instrument the plain model')


def pick_gemm(block: Block, tokens: int = 1024, repeats: int = 7) -> str:
    """The GEMM library (``deploy.fused.GEMMS``) that runs ``block``'s fused GEMMs faster on this machine: the
    output projection with its residual and the MLP on ``tokens`` random tokens with each library, interleaved
    ``repeats`` times after two warm-up rounds; the lower median wins (well under a second). Which wins depends
    on the CPU (oneDNN's AVX-512 kernels against MKL's AVX2 ones on AMD CPUs, say)."""
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
    in ``model``; pass it to ``optimize(model, precision='int8', input_ranges=...)``. Run the plain model: the
    fused path of an optimized one reads the layers' weights without calling them."""
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


def calibrated_ranges(model: nn.Module, calibration: Iterable[torch.Tensor] | None, keep_fp32: Sequence[str] = (),
                      cache: str | None = None) -> dict[str, tuple[float, float]]:
    """The input ranges of ``model``'s linear layers over the batches of ``calibration`` (``record_input_ranges``),
    or those saved at ``cache`` (a JSON file: ``images``, ``input_ranges``, ``source``) where they were recorded
    for this model (``check.model_fingerprint``) and hold a range for every layer outside ``keep_fp32``; newly
    recorded ranges are saved there. Ranges saved for another model (or by an older version, which recorded no
    model) are calibrated again with a warning. No calibration and nothing saved is an error saying what to
    pass."""
    from .check import model_fingerprint
    keep = tuple(keep_fp32)
    needed = [n for n, m in model.named_modules() if type(m) is nn.Linear and not n.startswith(keep)]
    source = model_fingerprint(model) if cache else None
    if cache and Path(cache).is_file():
        try:
            record = json.loads(Path(cache).read_text())
            saved = record['input_ranges']
        except (OSError, ValueError, KeyError, TypeError):
            record, saved = {}, {}
        if record.get('source') != source:
            warnings.warn(f'fused int8 ranges {cache}: '
                          + ('recorded for another model' if record.get('source') else 'no record of the model they '
                             'were calibrated for') + '; calibrating again', RuntimeWarning, stacklevel=3)
        elif all(n in saved for n in needed):
            return saved
    if calibration is None:
        raise ValueError("int8 quantizes activations at calibrated ranges: pass calibration=<input batches> (or "
                         'input_ranges=... from record_input_ranges)')
    images = 0
    with record_input_ranges(model) as ranges:
        for batch in calibration:
            model(batch)
            images += len(batch)
    if not images:
        raise ValueError('int8 calibration gave no input batch: pass a non-empty iterable of input batches')
    if cache:
        atomic_write(cache, json.dumps(dict(images=images, input_ranges=ranges, source=source), indent=1).encode())
    return ranges


def optimize(model: nn.Module, gemm: str = 'auto', precision: str = 'fp32', keep_fp32: Sequence[str] = (),
             input_ranges: Mapping[str, Sequence[float]] | None = None, inplace: bool = True) -> nn.Module:
    """Swap in the fused CPU modules; returns the model (``model`` itself, or with ``inplace=False`` a
    transformed copy, leaving ``model`` as it was). The model must be float32 on the CPU (it may be moved later:
    elsewhere the fused modules run the plain computation).

    ``precision``: 'fp32' or 'int8' (int8 weights per output channel, uint8 activations at the calibrated
    ``input_ranges`` from ``record_input_ranges``, through oneDNN; quantizing activations per call instead
    measured slower at every benchmark case, docs/performance.md); 'bf16' is refused with what to use instead.
    ``keep_fp32``: name prefixes of linear layers that stay float32 at a lower precision (layers whose
    quantization costs accuracy). ``gemm``: the float32 library, 'mkl', 'onednn', or 'auto' (``pick_gemm``).
    Calling it on an optimized model is a no-op."""
    check_precision(precision)
    if precision not in PRECISION_KERNELS:
        raise ValueError(f"optimize runs {' or '.join(map(repr, PRECISION_KERNELS))}, not {precision!r}: for bf16 "
                         "run the plain model under autocast (cpvt_backbones.deploy.to_autocast(model)) or on "
                         "OpenVINO (cpvt_backbones.deploy.to_openvino(model, 'bf16'))")
    if gemm != 'auto' and gemm not in GEMMS:
        raise ValueError(f'gemm must be one of {list(GEMMS)} (or auto), got {gemm!r}')
    low = PRECISION_KERNELS[precision]
    if input_ranges is not None and precision != 'int8':
        raise ValueError(f'input_ranges calibrate int8; precision={precision!r} does not use them')
    if input_ranges is None and precision == 'int8':
        raise ValueError("optimize: precision='int8' quantizes activations at calibrated ranges: run the plain model "
                         'on a few representative inputs under record_input_ranges and pass input_ranges=...')
    if low is not None and not KERNELS[low].available():
        raise RuntimeError(f"optimize: precision={precision!r} cannot run here: {unavailable_reason(low)} "
                           f"(torch reports CPU capability {torch.backends.cpu.get_cpu_capability()})")
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.device.type != 'cpu' or tensor.dtype != torch.float32:
            raise ValueError(f'optimize works on a float32 CPU model; {name} is {tensor.dtype} on {tensor.device}')
    blocks = [(name, m) for name, m in model.named_modules() if type(m) is Block]
    if not blocks and not any(isinstance(m, FusedBlock) for m in model.modules()):
        raise ValueError(f'optimize: {type(model).__name__} has no cpvt_backbones transformer block to fuse')
    for name, block in blocks:
        _check_block(name, block)
    if not inplace:
        model = copy.deepcopy(model)
        blocks = [(name, model.get_submodule(name)) for name, _ in blocks]
    if blocks and gemm == 'auto':  # timed on a block of median width: the narrow first stage's is too close to call
        widths = sorted((b for _, b in blocks), key=lambda b: b.mlp.fc1.in_features)
        gemm = pick_gemm(widths[len(widths) // 2])
    keep = tuple(keep_fp32)
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    if input_ranges is not None:
        missing = [n for n, _ in linears if n not in input_ranges and not n.startswith(keep)]
        if missing:
            raise ValueError(f'optimize: input_ranges has no range for {len(missing)} linear layer(s) '
                             f'({", ".join(missing[:4])}{" ..." if len(missing) > 4 else ""}); calibrate this '
                             'model with record_input_ranges, or keep those layers in float32 (keep_fp32)')
    for name, block in blocks:
        set_submodule(model, name, FusedBlock(block))
    for name, layer in linears:
        kernel = gemm if low is None or name.startswith(keep) else low
        fused = FusedLinear(layer, check_kernel(kernel))
        if kernel == 'onednn_int8':
            fused.input_range = tuple(float(v) for v in input_ranges[name])
        set_submodule(model, name, fused)
    return model
