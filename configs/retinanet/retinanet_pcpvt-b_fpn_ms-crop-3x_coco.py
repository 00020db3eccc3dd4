# PCPVT-B RetinaNet 3x multi-scale (the paper: 46.4 AP).
_base_ = './retinanet_pcpvt-s_fpn_ms-crop-3x_coco.py'
model = dict(backbone=dict(arch='pcpvt_base', init_cfg=dict(checkpoint='pcpvt_base')))
