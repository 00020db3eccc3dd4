"""Inference engines, each an explicit transform of a built model (the models know nothing of them), all behind
one registry (``deploy.registry.ENGINES``; ``engine_table()`` renders it) and one way in, ``prepare(module,
engine, precision, ...)``:

* ``torch``: PyTorch eager; bf16 under ``torch.autocast`` with float32 outputs (``deploy.autocast``);
* ``fused`` (``deploy.optimize``, ``deploy.fused``): hand-fused PyTorch CPU kernels for our transformer blocks,
  float32 / static int8, needing nothing beyond torch;
* ``openvino`` (``deploy.openvino``): OpenVINO for the CPU, float32 / bf16 / int8 (NNCF);
* ``onnxruntime`` (``deploy.onnxruntime``): onnxruntime on the ONNX export (``deploy.onnx``), float32, and int8 through
  onnxruntime's static quantization of the linear layers.

``run_images`` (``deploy.batched``) runs a model or a prepared one over images of many sizes in padded batches,
each image's output the one it gets alone.

An engine covers our backbone or any module that maps an image batch to tensors (a backbone, a classifier, an
OpenMMLab model's backbone + neck + head in tensor mode, ``deploy.openmmlab``). All take one precision
vocabulary (``deploy.precision.PRECISIONS``). Optional engines import their package on first use and name what
to install when it is missing.
"""
from .autocast import AutocastModule, to_autocast
from .batched import run_images
from .onnxruntime import OnnxRuntimeModule, to_onnxruntime
from .openvino import OpenVINOModule, to_openvino
from .optimize import optimize, record_input_ranges
from .precision import PRECISIONS, check_precision
from .registry import ENGINES, Engine, EngineRequest, engine_table, prepare

__all__ = ['AutocastModule', 'ENGINES', 'Engine', 'EngineRequest', 'OnnxRuntimeModule', 'OpenVINOModule', 'PRECISIONS',
           'check_precision', 'engine_table', 'optimize', 'prepare', 'record_input_ranges', 'run_images',
           'to_autocast', 'to_onnxruntime', 'to_openvino']
