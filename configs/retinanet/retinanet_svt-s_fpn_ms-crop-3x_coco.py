# Twins-SVT-S RetinaNet 3x with multi-scale training: the PCPVT-S 3x recipe (DETR-style augmentation, AdamW lr
# 1e-4, wd 0.05 without the position encodings and norms, 36 epochs) with the SVT-S backbone.
_base_ = './retinanet_pcpvt-s_fpn_ms-crop-3x_coco.py'
model = dict(
    backbone=_base_.svt_small,
    neck=dict(in_channels=[64, 128, 256, 512]))
