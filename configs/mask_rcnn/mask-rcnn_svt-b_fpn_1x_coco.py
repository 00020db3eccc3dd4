# Mask R-CNN with a Twins-SVT-B backbone, COCO 1x (PVT setting): the SVT-S recipe with the base backbone.
_base_ = './mask-rcnn_svt-s_fpn_1x_coco.py'
model = dict(backbone=dict(arch=dict(base='svt_base'), init_cfg=dict(checkpoint='svt_base')),
             neck=dict(in_channels=[96, 192, 384, 768]))
