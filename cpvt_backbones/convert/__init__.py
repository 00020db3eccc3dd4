"""Weight files and key layouts (torch only)."""
from .io import load_weights_file, unwrap_state_dict
from .layouts import UnknownKeysError, detect_layout, mmseg_to_twins, to_twins, twins_to_mmseg
from .loading import CheckpointMismatchError, LoadReport, load_into, load_pretrained

__all__ = ['CheckpointMismatchError', 'LoadReport', 'UnknownKeysError', 'detect_layout', 'load_into',
           'load_pretrained', 'load_weights_file', 'mmseg_to_twins', 'to_twins', 'twins_to_mmseg',
           'unwrap_state_dict']
