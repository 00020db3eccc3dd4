"""Weight files, key layouts and published weights (torch only)."""
from .hub import PRETRAINED, WeightSource, WeightsUnavailableError, fetch_weights, resolve_checkpoint, weights_dir
from .io import allow_globals, load_weights_file, safe_load, unwrap_state_dict
from .layouts import (
                  UnknownKeysError,
                  UnknownLayoutError,
                  backbone_only,
                  classifier_to_native,
                  deit_to_native,
                  detect_layout,
                  from_native,
                  mmpretrain_to_native,
                  mmseg_to_native,
                  native_to_classifier,
                  native_to_mmpretrain,
                  native_to_mmseg,
                  native_to_rope_vit,
                  rope_vit_to_native,
                  to_native,
)
from .loading import CheckpointMismatchError, LoadReport, built_weights, load_into, load_pretrained

__all__ = ['PRETRAINED', 'CheckpointMismatchError', 'LoadReport', 'UnknownKeysError', 'UnknownLayoutError',
           'WeightSource', 'WeightsUnavailableError', 'allow_globals', 'backbone_only', 'built_weights',
           'classifier_to_native', 'deit_to_native', 'detect_layout', 'fetch_weights', 'from_native', 'load_into',
           'load_pretrained',
           'load_weights_file', 'mmpretrain_to_native', 'mmseg_to_native', 'resolve_checkpoint', 'rope_vit_to_native',
           'safe_load', 'to_native', 'native_to_classifier', 'native_to_mmpretrain', 'native_to_mmseg',
           'native_to_rope_vit', 'unwrap_state_dict', 'weights_dir']
