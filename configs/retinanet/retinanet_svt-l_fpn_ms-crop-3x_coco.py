# Twins-SVT-L RetinaNet 3x multi-scale (the SVT-S recipe with the large backbone).
_base_ = './retinanet_svt-s_fpn_ms-crop-3x_coco.py'
model = dict(backbone=dict(arch=dict(base='svt_large'), init_cfg=dict(checkpoint='svt_large')),
             neck=dict(in_channels=[128, 256, 512, 1024]))
