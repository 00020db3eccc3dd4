# Mask R-CNN with a PCPVT-L backbone, COCO 3x multi-scale (Swin setting): the PCPVT-S recipe with the large backbone.
_base_ = './mask-rcnn_pcpvt-s_fpn_ms-crop-3x_coco.py'
model = dict(backbone=dict(arch='pcpvt_large', init_cfg=dict(checkpoint='pcpvt_large')))
