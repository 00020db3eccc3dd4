# What the detection and segmentation configs share (each imports its framework's adapter and the two opt-ins,
# safe and atomic mmengine checkpoints and RNGStateHook: docs/openmmlab.md). Resume draws what an uninterrupted
# run would; a non-finite loss stops the run, keeping the finite checkpoints. The backbones are named with their
# published ImageNet weights (fetched once into the cache and checked: cpvt_backbones.convert.hub; init_cfg's
# checkpoint also takes a path or a URL).
custom_hooks = [dict(type='RNGStateHook'), dict(type='NonFiniteLossHook')]
pcpvt_small = dict(_delete_=True, type='PyramidCPVT', arch='pcpvt_small', out_indices=(0, 1, 2, 3),
                   drop_path_rate=0.2, init_cfg=dict(type='Pretrained', checkpoint='pcpvt_small'))
# SVT for dense tasks masks the tokens that pad a map to whole 7 x 7 windows out of windowed attention (the Twins
# release's dense code; its authors recommend it for dense tasks)
svt_small = dict(_delete_=True, type='TwinsSVT', arch=dict(base='svt_small', window_mask=True),
                 out_indices=(0, 1, 2, 3), drop_path_rate=0.2,
                 init_cfg=dict(type='Pretrained', checkpoint='svt_small'))
