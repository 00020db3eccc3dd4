# cpvt_tiny_gap (CPVT-Ti-GAP, PEG after blocks 0-5) classifying the 64 x 64 shape crops on CPU in minutes:
# the classification pipeline end to end (tests/test_classification.py).
_base_ = './pcpvt-tiny_shapes-cls.py'

model = dict(backbone=dict(type='CPVT', arch='cpvt_tiny_gap', drop_path_rate=0.1), head=dict(in_channels=192))
optim_wrapper = dict(optimizer=dict(lr=1e-3))
