"""Registers our backbones (``backbones.BACKBONES``: ``PyramidCPVT``, ``TwinsSVT``, ``CPVT``, ``PVTv2``)
in mmpretrain's MODELS (``custom_imports=dict(imports=['cpvt_backbones.adapters.mmpretrain'])``)."""
from mmpretrain.registry import MODELS

from .backbones import register

register(MODELS)
