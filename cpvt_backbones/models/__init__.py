"""CPVT models (torch only)."""
from .cpvt import CPVT
from .factory import MODEL_SPECS, ModelSpec, create_model, list_models, model_settings
from .pcpvt import PyramidCPVT
from .svt import TwinsSVT

__all__ = ['CPVT', 'MODEL_SPECS', 'ModelSpec', 'PyramidCPVT', 'TwinsSVT', 'create_model', 'list_models',
           'model_settings']
