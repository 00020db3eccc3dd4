"""Registers ``PyramidCPVT``, ``TwinsSVT`` and ``CPVT`` in mmpretrain's MODELS
(``custom_imports=dict(imports=['cpvt_backbones.adapters.mmpretrain'])``)."""
from mmpretrain.registry import MODELS

from .backbones import CPVT, PyramidCPVT, TwinsSVT

MODELS.register_module(module=PyramidCPVT)
MODELS.register_module(module=TwinsSVT)
MODELS.register_module(module=CPVT)
