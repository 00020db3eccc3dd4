# PCPVT-L: 45.1 AP in the paper (71.2M with the stray ImageNet head; 70.73M here).
_base_ = './retinanet_pcpvt-s_fpn_1x_coco.py'
model = dict(backbone=dict(arch='pcpvt_large', init_cfg=dict(checkpoint='pcpvt_large')))
