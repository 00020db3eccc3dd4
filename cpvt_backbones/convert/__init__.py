"""Weight files, key layouts and published weights (torch only)."""
from .hub import (PRETRAINED, WeightSource, WeightsUnavailableError, fetch_weights, resolve_checkpoint,
                  weights_dir)
from .io import load_weights_file, unwrap_state_dict
from .layouts import (UnknownKeysError, backbone_only, classifier_to_twins, deit_to_twins, detect_layout,
                      from_twins, mmpretrain_to_twins, mmseg_to_twins, rope_vit_to_twins, to_twins,
                      twins_to_classifier, twins_to_mmpretrain, twins_to_mmseg, twins_to_rope_vit)
from .loading import CheckpointMismatchError, LoadReport, built_weights, load_into, load_pretrained

__all__ = ['PRETRAINED', 'CheckpointMismatchError', 'LoadReport', 'UnknownKeysError', 'WeightSource',
           'WeightsUnavailableError', 'backbone_only', 'built_weights', 'classifier_to_twins', 'deit_to_twins',
           'detect_layout', 'fetch_weights', 'from_twins', 'load_into', 'load_pretrained', 'load_weights_file',
           'mmpretrain_to_twins', 'mmseg_to_twins', 'resolve_checkpoint', 'rope_vit_to_twins', 'to_twins',
           'twins_to_classifier', 'twins_to_mmpretrain', 'twins_to_mmseg', 'twins_to_rope_vit', 'unwrap_state_dict',
           'weights_dir']
