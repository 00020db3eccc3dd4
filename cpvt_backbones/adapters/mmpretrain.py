"""Registers ``PyramidCPVT``, ``TwinsSVT``, ``CPVT`` and ``PVTv2`` in mmpretrain's MODELS
(``custom_imports=dict(imports=['cpvt_backbones.adapters.mmpretrain'])``)."""
from mmpretrain.registry import MODELS

from .backbones import CPVT, PVTv2, PyramidCPVT, TwinsSVT

MODELS.register_module(module=PyramidCPVT)
MODELS.register_module(module=TwinsSVT)
MODELS.register_module(module=CPVT)
MODELS.register_module(module=PVTv2)
