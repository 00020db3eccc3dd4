"""Registers ``PyramidCPVT`` and ``CPVT`` in mmseg's MODELS
(``custom_imports=dict(imports=['cpvt_backbones.adapters.mmseg'])``)."""
from mmseg.registry import MODELS

from .backbones import CPVT, PyramidCPVT

MODELS.register_module(module=PyramidCPVT)
MODELS.register_module(module=CPVT)
