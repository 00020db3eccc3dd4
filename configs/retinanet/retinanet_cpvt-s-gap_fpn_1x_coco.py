# RetinaNet with the columnar CPVT-S-GAP: its stride-16 tokens feed a ViTDet-style simple feature pyramid.
# The FPN starts at stride 8, so only the stride-8/16/32 levels (192/384/384 channels) are built and the
# neck starts at its first input; otherwise the PCPVT-S 1x recipe. No ImageNet weights are published for
# CPVT-S-GAP: train them with configs/imagenet/cpvt-small-gap_8xb128_in1k.py and set init_cfg's checkpoint.
_base_ = './retinanet_pcpvt-s_fpn_1x_coco.py'
model = dict(
    backbone=dict(type='CPVT', arch='cpvt_small_gap', out_indices=(1, 2, 3), drop_path_rate=0.1,
                  init_cfg=dict(checkpoint='cpvt_small_gap')),
    neck=dict(in_channels=[192, 384, 384], start_level=0))
