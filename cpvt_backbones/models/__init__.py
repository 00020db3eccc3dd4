"""CPVT models (torch only)."""
from .cpvt import CPVT
from .factory import MODEL_SPECS, ModelSpec, create_model, list_models, model_settings
from .pcpvt import Pyramid, PyramidCPVT
from .pvt_v2 import PVTv2
from .svt import TwinsSVT

__all__ = ['CPVT', 'MODEL_SPECS', 'ModelSpec', 'PVTv2', 'Pyramid', 'PyramidCPVT', 'TwinsSVT', 'create_model',
           'list_models', 'model_settings']
