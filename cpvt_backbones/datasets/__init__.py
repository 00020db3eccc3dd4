"""Datasets that need no download: generated shapes (numpy and Pillow) and Fashion-MNIST from local files."""
from .fashion_mnist import load_fashion_mnist, read_idx
from .shapes import (
                     CLASSES,
                     Scene,
                     ShapesSpec,
                     class_scenes,
                     generate_drawn_split,
                     generate_shape_crops,
                     generate_shapes,
                     render,
                     shape_scenes,
)

__all__ = ['CLASSES', 'Scene', 'ShapesSpec', 'class_scenes', 'generate_drawn_split', 'generate_shape_crops',
           'generate_shapes', 'load_fashion_mnist', 'read_idx', 'render', 'shape_scenes']
