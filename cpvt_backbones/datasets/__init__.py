"""Small generated datasets that need no download (numpy and Pillow only)."""
from .shapes import CLASSES, PALETTE, ShapesSpec, generate_shape_crops, generate_shapes

__all__ = ['CLASSES', 'PALETTE', 'ShapesSpec', 'generate_shape_crops', 'generate_shapes']
