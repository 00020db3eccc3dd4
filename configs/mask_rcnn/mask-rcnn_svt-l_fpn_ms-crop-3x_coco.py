# Mask R-CNN with a Twins-SVT-L backbone, COCO 3x multi-scale (Swin setting): the SVT-S recipe with the large backbone.
_base_ = './mask-rcnn_svt-s_fpn_ms-crop-3x_coco.py'
model = dict(backbone=dict(arch=dict(base='svt_large'), init_cfg=dict(checkpoint='svt_large')),
             neck=dict(in_channels=[128, 256, 512, 1024]))
