# RetinaNet + FPN with a PVTv2-B2 backbone, COCO 1x, as mmdet ships it
# (configs/pvt/retinanet_pvtv2-b2_fpn_1x_coco.py); the recipe as B0's.
_base_ = './retinanet_pvtv2-b0_fpn_1x_coco.py'
model = dict(backbone=dict(arch='pvt_v2_b2', init_cfg=dict(checkpoint='pvt_v2_b2')),
             neck=dict(in_channels=[64, 128, 320, 512]))
