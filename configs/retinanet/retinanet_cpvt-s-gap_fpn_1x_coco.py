# RetinaNet with the columnar CPVT-S-GAP: its stride-16 tokens feed a ViTDet-style simple feature pyramid.
# The FPN starts at stride 8, so only the stride-8/16/32 levels (192/384/384 channels) are built and the
# neck starts at its first input; otherwise the PCPVT-S 1x recipe.
_base_ = './retinanet_pcpvt-s_fpn_1x_coco.py'
model = dict(
    backbone=dict(type='CPVT', arch='cpvt_small_gap', out_indices=(1, 2, 3), drop_path_rate=0.1,
                  init_cfg=dict(checkpoint='checkpoints/cpvt_small_gap_in1k.pth')),
    neck=dict(in_channels=[192, 384, 384], start_level=0))
