# Twins-SVT-L RetinaNet, COCO 1x (the SVT-S config with the large backbone).
_base_ = './retinanet_svt-s_fpn_1x_coco.py'
model = dict(backbone=dict(arch=dict(base='svt_large'), init_cfg=dict(checkpoint='svt_large')),
             neck=dict(in_channels=[128, 256, 512, 1024]))
