# PCPVT-B: 44.3 AP in the paper (54.1M with the stray ImageNet head; 53.57M here).
_base_ = './retinanet_pcpvt-s_fpn_1x_coco.py'
model = dict(backbone=dict(arch='pcpvt_base', init_cfg=dict(checkpoint='pcpvt_base')))
