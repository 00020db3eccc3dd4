# Mask R-CNN with a Twins-SVT-S backbone, COCO 3x multi-scale (Swin setting): the PCPVT-S recipe with the SVT-S
# backbone (configs/_base_/cpvt.py: windowed attention masks the tokens that pad a map to whole windows).
_base_ = './mask-rcnn_pcpvt-s_fpn_ms-crop-3x_coco.py'
model = dict(
    backbone=_base_.svt_small,
    neck=dict(in_channels=[64, 128, 256, 512]))
