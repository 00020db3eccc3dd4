# Mask R-CNN with a PCPVT-B backbone, COCO 3x multi-scale (Swin setting): the PCPVT-S recipe with the base backbone.
_base_ = './mask-rcnn_pcpvt-s_fpn_ms-crop-3x_coco.py'
model = dict(backbone=dict(arch='pcpvt_base', init_cfg=dict(checkpoint='pcpvt_base')))
