"""Inference engines, each an explicit transform of a built model (the models know nothing of them):

* ``optimize`` (``deploy.optimize``, ``deploy.fused``): hand-fused PyTorch CPU kernels for our transformer
  blocks, float32 / static int8, needing nothing beyond torch;
* ``to_autocast`` (``deploy.autocast``): torch's bf16, the model run under ``torch.autocast`` with float32
  outputs, for a backbone or a whole OpenMMLab model (``deploy.openmmlab.to_autocast_model``);
* ``deploy.onnx``: ONNX export with dynamic batch, height and width, checked with onnxruntime;
* ``to_openvino`` (``deploy.openvino``): OpenVINO for the CPU, float32 / bf16 / int8 (NNCF), for a backbone or a
  whole OpenMMLab model's tensor-mode forward.

All take one precision vocabulary (``deploy.precision.PRECISIONS``). Optional engines import their package on
first use and name the extra to install when it is missing.
"""
from .autocast import AutocastModule, to_autocast
from .openvino import OpenVINOModule, to_openvino
from .optimize import optimize, record_input_ranges
from .precision import PRECISIONS, check_precision

__all__ = ['AutocastModule', 'OpenVINOModule', 'PRECISIONS', 'check_precision', 'optimize', 'record_input_ranges',
           'to_autocast', 'to_openvino']
