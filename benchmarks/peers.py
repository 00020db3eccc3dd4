"""The implementations the speed benchmark times, all on the same weights: every registered engine (``deploy.ENGINES``)
at float32 and at each lower precision asked for that it runs, listed from the registry and prepared through
``deploy.prepare`` (bf16 only on CPUs with native bf16; int8 calibrated on random images, which decides accuracy, not
speed); mmseg's ``PCPVT``/``SVT`` and timm's ``twins_pcpvt_*``/``twins_svt_*`` (``PEER_NAMES``; SVT on the engines
and mmseg's with the padding of windows masked out, as the dense configs run it, timm's without, so its maps differ
where windows are padded); onnxruntime's own dynamic int8 quantization of our export (``onnxruntime_dynamic_int8``:
what a deployer would try instead of a calibrated int8); with ``engines``, OpenVINO compiled per shape, OpenVINO used
by hand and torch.compile (inductor with freezing, dynamic shapes). Each maps a batch to its tuple of four NCHW maps.
Registered engines are named ``<engine>`` (float32) or ``<engine>_<precision>`` (``impl_name``); the others keep
their projects' names (``mmseg``, ``timm``) or say what they are (``openvino_by_hand``, ``torch_compile``). The
reference every other is compared with is ``fused`` (``REFERENCE``).

``build_dense`` gives the end-to-end implementations: a whole RetinaNet or Semantic FPN with ``pcpvt_small``
(the COCO and ADE20K configs, random weights) in tensor mode (backbone + neck + head; preprocessing and
post-processing are the framework's Python in every implementation, so they are left out), on every registered
engine (``deploy.openmmlab.on_engine``), named as above; the reference is ``torch`` (``DENSE_REFERENCE``), the
model as it is. Each maps a batch to the flat tuple of the tensor-mode outputs."""
import contextlib
import copy
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten

from benchmarks.timing import has_fast_bf16
from cpvt_backbones import create_model
from cpvt_backbones.convert import native_to_mmseg
from cpvt_backbones.deploy import ENGINES, PRECISIONS, prepare
from cpvt_backbones.deploy.engines.onnxruntime import OnnxRuntimeModule
from cpvt_backbones.models import PyramidCPVT, TwinsSVT, model_settings
from cpvt_backbones.utils import cpu_info

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = 'fused'   # the backbone benchmark's reference: the others are timed and compared against it
DENSE_REFERENCE = 'torch'   # end to end: the model as it is


def impl_name(engine: str, precision: str) -> str:
    """The benchmarks' name of ``engine`` at ``precision``: ``<engine>`` at float32, else ``<engine>_<precision>``."""
    return engine if precision == 'fp32' else f'{engine}_{precision}'


def registered() -> tuple[str, ...]:
    """Every (engine, precision) of the registry by its benchmark name, in registry order."""
    return tuple(impl_name(e, p) for e, spec in ENGINES.items() for p in PRECISIONS if p in spec.precisions)


PEER_NAMES = ('pcpvt_small', 'pcpvt_base', 'pcpvt_large', 'svt_small', 'svt_base', 'svt_large')
PEERS = tuple(n for n in registered() if n != REFERENCE) + (
    'mmseg', 'timm', 'onnxruntime_dynamic_int8', 'openvino_static', 'openvino_by_hand', 'torch_compile')


def engine_impls(prepare_one: Callable, precisions: Sequence[str],
                 skip: Sequence[str] = ()) -> dict[str, torch.nn.Module]:
    """``{name: prepare_one(engine, precision)}`` for every registered engine outside ``skip`` whose packages
    are installed, at float32 and each of ``precisions`` it runs (bf16 only where the CPU has it natively: a
    printed line says what is left out); each marked ``inference_only`` unless the engine trains at that
    precision."""
    impls = {}
    for engine, spec in ENGINES.items():
        if engine in skip:
            continue
        if spec.missing():
            print(f'[bench] {engine} left out: {", ".join(spec.missing())} not installed')
            continue
        for precision in ('fp32', *precisions):
            if precision not in spec.precisions:
                continue
            name = impl_name(engine, precision)
            if precision == 'bf16' and not has_fast_bf16(cpu_info()):
                print(f'[bench] {name} left out: this CPU has no native bf16 (avx512_bf16 or AMX)')
                continue
            impls[name] = prepare_one(engine, precision)
            impls[name].inference_only = precision not in spec.trains
    return impls


def build(name: str, peers: bool = True, onnx_dir: str = 'work_dirs/bench_onnx', precisions: Sequence[str] = (),
          engines: bool = False, skip: Sequence[str] = ()) -> dict[str, Callable]:
    """``engine_impls`` of the backbone for the registered engines outside ``skip`` (``fused``, the reference;
    ``torch``: the model as it is; onnxruntime's export kept in ``onnx_dir``, with int8 in ``precisions`` also
    ``onnxruntime_dynamic_int8``, onnxruntime's dynamic int8 of that export, beside the engine's static
    ``onnxruntime_int8``), ``mmseg`` and ``timm`` (with ``peers``), and with ``engines`` the extras of ``_engines``:
    each maps a batch to its four NCHW maps."""
    weights, model = backbone(name)
    calibration = [torch.randn(2, 3, 224, 224)]  # int8 ranges for the speed test: random images (same timing)

    def prepare_one(engine: str, precision: str) -> torch.nn.Module:
        options = (dict(cache=str(Path(onnx_dir) / f'{name}-{precision}'), float_cache=str(Path(onnx_dir) / name))
                   if engine == 'onnxruntime' else {})
        module = model if ENGINES[engine].transform is ENGINES['torch'].transform else copy.deepcopy(model)
        return prepare(module, engine, precision, calibration=calibration if precision == 'int8' else None, **options)
    impls = engine_impls(prepare_one, precisions, skip)
    if 'onnxruntime' in impls and 'int8' in precisions:
        impls['onnxruntime_dynamic_int8'] = _onnxruntime_dynamic_int8(impls['onnxruntime'])
    if peers and name in PEER_NAMES:
        impls['mmseg'] = _mmseg(name, weights)
        impls['timm'] = _timm(name, weights)
    if engines:
        impls.update(_engines(model))
    return impls


def backbone(name: str) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    """Random weights of the classifier ``name`` (seed 0) and its feature pyramid with them, in evaluation mode
    (Twins-SVT's with masked windows, the dense configs' form)."""
    torch.manual_seed(0)
    weights = create_model(name).state_dict()
    dense = dict(window_mask=True) if name.startswith('svt_') else {}
    model = create_model(name, features_only=True, **dense).eval()
    model.load_state_dict({k: v for k, v in weights.items() if not k.startswith(('norm.', 'head.'))})
    return weights, model


def fused_backbone(name: str) -> torch.nn.Module:
    """``backbone(name)`` on the fused engine: what --scaling and --breakdown time."""
    return prepare(backbone(name)[1], 'fused')


def _onnxruntime_dynamic_int8(engine: OnnxRuntimeModule) -> OnnxRuntimeModule:
    """onnxruntime's dynamic int8 quantization (int8 weights per channel) of the onnxruntime engine's export."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    int8 = Path(engine.path).with_suffix('.int8.onnx')
    quantize_dynamic(engine.path, str(int8), per_channel=True, weight_type=QuantType.QInt8)
    out = OnnxRuntimeModule(str(int8), engine.out_spec, engine.in_chans)
    out.inference_only = True
    return out


# The paper's detector and segmentor (timed by default), and the demo's small Semantic FPN.
DENSE_CONFIGS = {'retinanet': 'configs/retinanet/retinanet_pcpvt-s_fpn_1x_coco.py',
                 'semantic_fpn': 'configs/sem_fpn/fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py',
                 'semantic_fpn_shapes': 'configs/shapes/fpn_pcpvt-tiny_shapes.py'}
DEFAULT_DENSE = ('retinanet', 'semantic_fpn')
DENSE_PEERS = tuple(n for n in registered() if n != DENSE_REFERENCE)


def dense_model(task: str) -> torch.nn.Module:
    """The detector or segmentor of ``DENSE_CONFIGS[task]`` with random weights (seed 0), in evaluation mode."""
    from mmengine.registry import MODELS, init_default_scope

    from cpvt_backbones.adapters.runner import load_config
    cfg = load_config(str(ROOT / DENSE_CONFIGS[task]))
    init_default_scope(cfg.default_scope)
    torch.manual_seed(0)
    return MODELS.build(cfg.model).eval()


class _TensorMode(torch.nn.Module):
    """``model._forward`` (mmdet's and mmseg's ``mode='tensor'``: backbone, neck and head) with its outputs
    flattened into one tuple."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return tuple(tree_flatten(self.model._forward(x))[0])


def build_dense(task: str, precisions: Sequence[str] = (), calibration_size: tuple[int, int] = (512, 512),
                skip: Sequence[str] = ()) -> tuple[dict[str, torch.nn.Module], dict]:
    """(``engine_impls`` of the config's model in tensor mode for the registered engines outside ``skip``, each
    through ``deploy.openmmlab.on_engine`` on a copy, ``torch`` the model as it is; {implementation: seconds to
    build it, the reference left out}): the build time is the engines' conversion, quantization and compilation.
    int8 is calibrated on two random images of ``calibration_size`` (which decides accuracy, not speed)."""
    from cpvt_backbones.deploy.openmmlab import on_engine
    model = dense_model(task)
    calibration = [torch.randn(1, 3, *calibration_size, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    setup = {}

    def prepare_one(engine: str, precision: str) -> torch.nn.Module:
        start = time.perf_counter()
        prepared = on_engine(copy.deepcopy(model), engine, precision, calibration if precision == 'int8' else None)
        setup[impl_name(engine, precision)] = time.perf_counter() - start
        return _TensorMode(prepared)
    impls = engine_impls(prepare_one, precisions, skip)
    setup.pop(DENSE_REFERENCE, None)
    return impls, setup


def _engines(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """What the registry's engines are compared with: OpenVINO compiled per shape (its ``'static'`` shapes; the
    registered engine runs ``'auto'``, which stays on the dynamic model through a case's few calls;
    ``benchmarks/openvino_shapes.py`` measures it on streams), OpenVINO used by hand, without this package,
    and torch.compile, each timed from its first call."""
    model = model.eval()
    out = {'openvino_static': prepare(model, 'openvino', shapes='static'),
           'openvino_by_hand': _OpenVINOByHand(model), 'torch_compile': _Compiled(model)}
    for impl in out.values():
        impl.inference_only = True
    return out


class _OpenVINOByHand(torch.nn.Module):
    """OpenVINO as a user would call it without this package: ``openvino.convert_model`` on the module (its
    TorchScript front end, every input dimension dynamic) and ``compile_model(model, 'CPU')`` with the plugin's
    defaults (bf16 inference precision on CPUs with native bf16, float32 elsewhere)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        import openvino as ov
        with torch.no_grad():
            converted = ov.convert_model(model.eval(), example_input=torch.randn(1, 3, 224, 224))
        self.compiled = ov.Core().compile_model(converted, 'CPU')

    def forward(self, x):
        result = self.compiled(x.contiguous().numpy())
        return tuple(torch.from_numpy(result[port]) for port in self.compiled.outputs)


class _Compiled(torch.nn.Module):
    """``torch.compile`` (inductor, dynamic shapes) with inductor's freezing (weights folded as constants in
    inference), the settings a user would try for CPU inference."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.compiled = torch.compile(model, dynamic=True)

    def forward(self, x):
        import torch._inductor.config as inductor
        with torch.no_grad(), _setting(inductor, 'freezing', True):
            return self.compiled(x)


@contextlib.contextmanager
def _setting(module, name: str, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


class _Calling(torch.nn.Module):
    """``model`` (a submodule, so ``train``/``eval`` reach it) run as ``call(model, x)``."""

    def __init__(self, model: torch.nn.Module, call: Callable):
        super().__init__()
        self.model, self.call = model, call

    def forward(self, x):
        return self.call(self.model, x)


def _mmseg(name: str, weights) -> torch.nn.Module:
    from mmseg.models.backbones import PCPVT, SVT
    svt = name.startswith('svt_')
    s = model_settings(name, TwinsSVT if svt else PyramidCPVT)
    common = dict(embed_dims=list(s['embed_dims']), patch_sizes=[4, 2, 2, 2], strides=[4, 2, 2, 2],
                  num_heads=list(s['num_heads']), mlp_ratios=list(s['mlp_ratios']), depths=list(s['depths']),
                  sr_ratios=list(s['sr_ratios']), out_indices=(0, 1, 2, 3), qkv_bias=True, norm_cfg=dict(type='LN'),
                  norm_after_stage=False, drop_path_rate=0.)
    # mmseg spells SVT's window sizes 'windiow_sizes'
    model = SVT(windiow_sizes=list(s['window_sizes']), **common) if svt else PCPVT(**common)
    model.load_state_dict(native_to_mmseg(weights), strict=True)
    for layer_name, module in model.named_modules():
        if re.fullmatch(r'layers\.\d+\.\d+\.norm[12]', layer_name):
            module.eps = 1e-6
    return model


def _timm(name: str, weights) -> torch.nn.Module:
    import timm
    model = timm.create_model(f'twins_{name}', pretrained=False)
    model.load_state_dict(weights, strict=True)
    return _Calling(model, lambda m, x: tuple(m.forward_intermediates(x, intermediates_only=True)))
