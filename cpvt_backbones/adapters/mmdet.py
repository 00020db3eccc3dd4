"""Registers ``PyramidCPVT``, ``TwinsSVT`` and ``CPVT`` in mmdet's MODELS
(``custom_imports=dict(imports=['cpvt_backbones.adapters.mmdet'])``)."""
from mmdet.registry import MODELS

from .backbones import CPVT, PyramidCPVT, TwinsSVT

MODELS.register_module(module=PyramidCPVT)
MODELS.register_module(module=TwinsSVT)
MODELS.register_module(module=CPVT)
