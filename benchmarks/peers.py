"""The implementations the speed benchmark times, all on the same weights: our backbone optimized (float32)
and plain, mmseg's ``PCPVT``, timm's ``twins_pcpvt_*``, onnxruntime on our ONNX export; with lower precisions
asked for, the plain model under bf16 autocast (``deploy.to_autocast``, on CPUs with native bf16), our optimized
model in int8 (activations at calibrated ranges), and onnxruntime's own dynamic int8 quantization of
our export (what a deployer would try instead); with ``engines``, OpenVINO (``deploy.openvino``: dynamic and
per-shape compiled float32, bf16, NNCF int8) and torch.compile (inductor with freezing, dynamic shapes).
Each maps a batch to its tuple of four NCHW maps.

``build_dense`` gives the end-to-end implementations: a whole RetinaNet or Semantic FPN with ``pcpvt_small``
(the COCO and ADE20K configs, random weights) in tensor mode (backbone + neck + head; preprocessing and
post-processing are the framework's Python in every implementation, so they are left out): torch eager, torch
with our backbone optimized (float32, static int8), the whole network in torch under bf16 autocast, and the whole
network on OpenVINO (``deploy.openmmlab``: float32, bf16, NNCF int8). Each maps a batch to the flat tuple of the
tensor-mode outputs."""
import contextlib
import copy
import re
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten

from cpvt_backbones import create_model, optimize, record_input_ranges
from cpvt_backbones.convert import native_to_mmseg
from cpvt_backbones.deploy import to_autocast
from cpvt_backbones.deploy.onnx import export
from cpvt_backbones.models import PyramidCPVT, model_settings
from benchmarks.timing import cpu_info, has_fast_bf16

ROOT = Path(__file__).resolve().parents[1]
PEERS = ('plain', 'mmseg', 'timm', 'onnxruntime', 'plain_bf16', 'ours_int8', 'onnxruntime_int8',
         'openvino', 'openvino_static', 'openvino_bf16', 'openvino_int8', 'openvino_by_hand', 'torch_compile')


def build(name: str, peers: bool = True, onnx_dir: Optional[str] = None,
          precisions: Sequence[str] = (), engines: bool = False) -> Dict[str, Callable]:
    """{'ours': optimized, 'plain': ours unoptimized, 'mmseg', 'timm', 'onnxruntime' (with ``onnx_dir``),
    'plain_bf16' (bf16 in ``precisions``: the plain model under autocast), 'ours_int8' and 'onnxruntime_int8'
    (int8 in ``precisions``)}: each maps a batch to its four NCHW maps. A bf16 entry is left out on a CPU
    without native bf16 (a printed line says so)."""
    torch.manual_seed(0)
    classifier = create_model(name)
    weights = classifier.state_dict()
    plain = create_model(name, features_only=True)
    plain.load_state_dict({k: v for k, v in weights.items() if not k.startswith(('norm.', 'head.'))})
    impls = {'ours': optimize(copy.deepcopy(plain)), 'plain': plain}
    for precision in precisions:
        if precision == 'bf16':
            if has_fast_bf16(cpu_info()):
                impls['plain_bf16'] = to_autocast(plain, 'bf16')
            else:
                print('[bench] bf16 left out: this CPU has no native bf16 (avx512_bf16 or AMX)')
            continue
        with record_input_ranges(plain) as ranges:  # int8 ranges for the speed test: random images (same timing)
            plain(torch.randn(2, 3, 224, 224))
        impls['ours_int8'] = optimize(plain, precision='int8', input_ranges=ranges, inplace=False)
        impls['ours_int8'].inference_only = True  # training runs the float32 path
    if peers and name in ('pcpvt_small', 'pcpvt_base', 'pcpvt_large'):
        impls['mmseg'] = _mmseg(name, weights)
        impls['timm'] = _timm(name, weights)
    if peers and onnx_dir is not None:
        impls['onnxruntime'] = _OnnxRuntime(plain, Path(onnx_dir) / f'{name}.onnx')
        if 'int8' in precisions:
            impls['onnxruntime_int8'] = _OnnxRuntime(plain, Path(onnx_dir) / f'{name}.onnx', quantize=True)
    if engines:
        impls.update(_engines(plain, precisions))
    return impls


DENSE_CONFIGS = {'retinanet': 'configs/retinanet/retinanet_pcpvt-s_fpn_1x_coco.py',
                 'semantic_fpn': 'configs/sem_fpn/fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py'}
DENSE_PEERS = ('optimized', 'optimized_int8', 'autocast_bf16', 'openvino', 'openvino_bf16', 'openvino_int8')


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


def build_dense(task: str, precisions: Sequence[str] = (),
                calibration_size: Tuple[int, int] = (512, 512)) -> Tuple[Dict[str, torch.nn.Module], Dict]:
    """({'eager': the config's model in torch float32, 'optimized': the same with our backbone through
    ``optimize``, 'optimized_int8' (int8 in ``precisions``), 'autocast_bf16' (bf16 in ``precisions``: the
    whole network under autocast, ``deploy.openmmlab.to_autocast_model``), 'openvino' and
    'openvino_<precision>': the whole tensor-mode network on OpenVINO}, {implementation: seconds to build it}):
    the build time is
    the engines' conversion, quantization and compilation. int8 is calibrated on two random images of
    ``calibration_size`` (which decides accuracy, not speed). A bf16 entry is left out on a CPU without native
    bf16 (a printed line says so)."""
    from cpvt_backbones.deploy.openmmlab import TensorForward, attach_engine, exportable, to_autocast_model
    from cpvt_backbones.deploy.openvino import OpenVINOModule, convert, native_bf16, quantize
    model = dense_model(task)
    calibration = [torch.randn(1, 3, *calibration_size, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    impls, setup = {'eager': _TensorMode(model)}, {}

    def add(key: str, make: Callable[[], torch.nn.Module]) -> None:
        start = time.perf_counter()
        impls[key] = make()
        impls[key].inference_only = True
        setup[key] = time.perf_counter() - start

    def with_backbone(**options) -> torch.nn.Module:
        optimized = copy.deepcopy(model)
        optimize(optimized.backbone, **options)
        return _TensorMode(optimized)

    add('optimized', with_backbone)
    for precision in precisions:
        if precision == 'bf16':
            if not has_fast_bf16(cpu_info()):
                print('[bench] autocast_bf16 and openvino_bf16 left out: this CPU has no native bf16')
            else:
                add('autocast_bf16', lambda: _TensorMode(to_autocast_model(copy.deepcopy(model), 'bf16')))
            continue
        with record_input_ranges(model.backbone) as ranges, torch.no_grad():
            for x in calibration:
                model.backbone(x)
        add('optimized_int8', lambda: with_backbone(precision='int8', input_ranges=ranges))

    def on_openvino(precision: str) -> torch.nn.Module:
        with exportable(model):
            ov_model, spec = convert(TensorForward(model), torch.randn(2, 3, *calibration_size))
        if precision == 'int8':
            ov_model = quantize(ov_model, calibration)
        return _TensorMode(attach_engine(copy.deepcopy(model), OpenVINOModule(ov_model, spec, 3, precision)))

    add('openvino', lambda: on_openvino('fp32'))
    for precision in precisions:
        if precision == 'bf16' and not native_bf16():
            continue
        add(f'openvino_{precision}', lambda: on_openvino(precision))
    return impls, setup


def _engines(plain: torch.nn.Module, precisions: Sequence[str]) -> Dict[str, torch.nn.Module]:
    """OpenVINO (dynamic shapes; per-shape compiled; bf16 and NNCF int8 where asked, dynamic, int8 calibrated on
    random images, which decides its accuracy, not its speed; and OpenVINO used by hand, without this package)
    and torch.compile, each timed from its first call. The package's default shapes, 'auto', would run the
    dynamic model through a case's few calls; ``benchmarks/openvino_shapes.py`` measures it on streams."""
    from cpvt_backbones.deploy.openvino import OpenVINOModule, convert, native_bf16, quantize
    plain = plain.eval()
    ov_model, spec = convert(plain, torch.randn(2, 3, 224, 224))
    out = {'openvino': OpenVINOModule(ov_model, spec, 3, shapes='dynamic'),
           'openvino_static': OpenVINOModule(ov_model, spec, 3, shapes='static'),
           'openvino_by_hand': _OpenVINOByHand(plain)}
    if 'bf16' in precisions:
        if native_bf16():
            out['openvino_bf16'] = OpenVINOModule(ov_model, spec, 3, 'bf16', shapes='dynamic')
        else:
            print('[bench] openvino_bf16 left out: OpenVINO reports no native bf16 on this CPU')
    if 'int8' in precisions:
        calibration = [torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(i)) for i in range(8)]
        out['openvino_int8'] = OpenVINOModule(quantize(ov_model, calibration), spec, 3, 'int8', shapes='dynamic')
    out['torch_compile'] = _Compiled(plain)
    for model in out.values():
        model.inference_only = True
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


class _OnnxRuntime(torch.nn.Module):
    """onnxruntime (CPU provider, default graph optimisations) on our ONNX export with dynamic H and W; with
    ``quantize``, on onnxruntime's dynamic int8 quantization of it (int8 weights per channel)."""

    inference_only = True

    def __init__(self, model, path: Path, quantize: bool = False):
        super().__init__()
        import onnxruntime as ort
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file():
            export(model.eval(), str(path), [f'stride{s}' for s in model.strides])
        if quantize:
            from onnxruntime.quantization import QuantType, quantize_dynamic
            int8 = path.with_name(path.stem + '.int8.onnx')
            quantize_dynamic(str(path), str(int8), per_channel=True, weight_type=QuantType.QInt8)
            path = int8
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])

    def forward(self, x):
        return tuple(torch.from_numpy(o) for o in self.session.run(None, {'image': x.contiguous().numpy()}))


def _mmseg(name: str, weights) -> torch.nn.Module:
    from mmseg.models.backbones import PCPVT
    s = model_settings(name, PyramidCPVT)
    model = PCPVT(embed_dims=list(s['embed_dims']), patch_sizes=[4, 2, 2, 2], strides=[4, 2, 2, 2],
                  num_heads=list(s['num_heads']), mlp_ratios=list(s['mlp_ratios']), depths=list(s['depths']),
                  sr_ratios=list(s['sr_ratios']), out_indices=(0, 1, 2, 3), qkv_bias=True, norm_cfg=dict(type='LN'),
                  norm_after_stage=False, drop_path_rate=0.)
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
