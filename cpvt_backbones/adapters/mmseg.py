"""Registers ``PyramidCPVT``, ``TwinsSVT`` and ``CPVT`` in mmseg's MODELS
(``custom_imports=dict(imports=['cpvt_backbones.adapters.mmseg'])``)."""
from mmseg.registry import MODELS

from .backbones import CPVT, PyramidCPVT, TwinsSVT

MODELS.register_module(module=PyramidCPVT)
MODELS.register_module(module=TwinsSVT)
MODELS.register_module(module=CPVT)
