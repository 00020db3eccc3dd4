"""Weight files and key layouts (torch only)."""
from .io import load_weights_file, unwrap_state_dict
from .layouts import (LAYOUTS, UnknownKeysError, backbone_only, classifier_to_twins, deit_to_twins, detect_layout,
                      rope_vit_to_twins, from_twins, mmpretrain_to_twins, mmseg_to_twins, to_twins, twins_to_rope_vit,
                      twins_to_mmpretrain, twins_to_mmseg)
from .loading import CheckpointMismatchError, LoadReport, built_weights, load_into, load_pretrained

__all__ = ['LAYOUTS', 'CheckpointMismatchError', 'LoadReport', 'UnknownKeysError', 'backbone_only', 'built_weights',
           'classifier_to_twins', 'deit_to_twins', 'detect_layout', 'rope_vit_to_twins', 'from_twins', 'load_into',
           'load_pretrained', 'load_weights_file', 'mmpretrain_to_twins', 'mmseg_to_twins', 'to_twins', 'twins_to_rope_vit',
           'twins_to_mmpretrain', 'twins_to_mmseg', 'unwrap_state_dict']
