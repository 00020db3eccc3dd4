# RetinaNet + FPN with a PVTv2-B3 backbone, COCO 1x, as mmdet ships it
# (configs/pvt/retinanet_pvtv2-b3_fpn_1x_coco.py); the recipe as B0's.
_base_ = './retinanet_pvtv2-b0_fpn_1x_coco.py'
model = dict(backbone=dict(arch='pvt_v2_b3', init_cfg=dict(checkpoint='pvt_v2_b3')),
             neck=dict(in_channels=[64, 128, 320, 512]))
