# Twins-SVT-B RetinaNet 3x multi-scale (the SVT-S recipe with the base backbone).
_base_ = './retinanet_svt-s_fpn_ms-crop-3x_coco.py'
model = dict(backbone=dict(arch=dict(base='svt_base'), init_cfg=dict(checkpoint='svt_base')),
             neck=dict(in_channels=[96, 192, 384, 768]))
