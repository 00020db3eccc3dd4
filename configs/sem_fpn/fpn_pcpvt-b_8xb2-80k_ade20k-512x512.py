# PCPVT-B Semantic FPN: 44.9 mIoU in the paper (48.1M with the stray ImageNet head; 47.58M here).
_base_ = './fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py'
model = dict(backbone=dict(arch='pcpvt_base', init_cfg=dict(checkpoint='pcpvt_base')))
