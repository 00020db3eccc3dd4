"""The engines, one file each, registered in ``deploy.registry.ENGINES`` as they are imported here (in the order of
``engine_table``). A new engine is a file here ending in one ``register`` call, plus its import below."""
from . import torch, fused, openvino, onnxruntime  # noqa: F401,I001  (registration order)
