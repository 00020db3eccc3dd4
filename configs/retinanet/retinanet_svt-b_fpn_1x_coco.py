# Twins-SVT-B RetinaNet, COCO 1x (the SVT-S config with the base backbone).
_base_ = './retinanet_svt-s_fpn_1x_coco.py'
model = dict(backbone=dict(arch=dict(base='svt_base'), init_cfg=dict(checkpoint='svt_base')),
             neck=dict(in_channels=[96, 192, 384, 768]))
