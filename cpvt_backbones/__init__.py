"""CPVT, pyramid CPVT (Twins-PCPVT) and Twins-SVT backbones with conditional positional encodings.

The package root and ``layers``, ``models``, ``convert`` need only the declared requirements, torch and safetensors
(``convert`` reads safetensors weight files with it); ``deploy`` holds the inference engines
(``deploy.ENGINES``: torch, the fused CPU path, OpenVINO, onnxruntime on the ONNX export), reached through
``prepare(model, engine, precision)``, each importing its engine's package only when used; ``run_images`` runs
a model over images of many sizes in padded batches, each image as if alone. The OpenMMLab
registrations live in
``cpvt_backbones.adapters.{mmdet,mmseg,mmpretrain}`` and are imported by configs through ``custom_imports``.
"""
from .deploy import prepare, record_input_ranges, run_images
from .models import CPVT, PyramidCPVT, TwinsSVT, create_model, list_models

__version__ = '0.1.0'
__all__ = ['CPVT', 'PyramidCPVT', 'TwinsSVT', 'create_model', 'list_models', 'prepare',
           'record_input_ranges', 'run_images']
