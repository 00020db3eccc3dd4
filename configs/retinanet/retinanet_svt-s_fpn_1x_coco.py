# RetinaNet + FPN with a Twins-SVT-S backbone, COCO 1x: the Twins release's PVT setting (as the PCPVT-S config).
# Windowed attention masks the tokens that pad a map to whole 7 x 7 windows (window_mask, the Twins release's
# detection code; the authors recommend it for dense tasks).
_base_ = './retinanet_pcpvt-s_fpn_1x_coco.py'
model = dict(
    backbone=_base_.svt_small,
    neck=dict(in_channels=[64, 128, 256, 512]))
