"""Inference engines, each an explicit transform of a built model (the models know nothing of them), reached by one
door, ``prepare(module, engine, precision, ...)`` (``deploy.registry``; ``engine_table()`` renders the registry):

* ``torch`` (``engines/torch.py``): PyTorch eager; bf16 under ``torch.autocast`` with float32 outputs;
* ``fused`` (``engines/fused.py``, kernels in ``deploy.kernels``): this package's fused PyTorch CPU kernels for our
  transformer blocks, float32 / static int8, needing nothing beyond torch;
* ``openvino`` (``engines/openvino.py``): OpenVINO for the CPU, float32 / bf16 / int8 (NNCF);
* ``onnxruntime`` (``engines/onnxruntime.py``): onnxruntime on the ONNX export (``deploy.onnx``), float32 / static
  int8.

What an engine derives (a conversion, a quantized model, calibrated ranges) is saved, checked and reused through
one cache, ``deploy.artifacts``. ``run_images`` (``deploy.batched``) runs a model or a prepared one over images of
many sizes in padded batches, each image's output the one it gets alone.

An engine covers our backbone or any module that maps an image batch to tensors (a backbone, a classifier, an
OpenMMLab model's backbone + neck + head in tensor mode, ``deploy.openmmlab``). All take one precision
vocabulary (``deploy.precision.PRECISIONS``). Optional engines import their package on first use and name what
to install when it is missing.
"""
from . import engines  # noqa: F401  (registers every engine)
from .batched import run_images
from .engines.fused import record_input_ranges
from .precision import PRECISIONS, check_precision
from .registry import ENGINES, Engine, EngineRequest, engine_table, prepare

__all__ = ['ENGINES', 'Engine', 'EngineRequest', 'PRECISIONS', 'check_precision', 'engine_table', 'prepare',
           'record_input_ranges', 'run_images']
