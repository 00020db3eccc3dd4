# PCPVT-L Semantic FPN: 46.4 mIoU in the paper (65.3M with the stray ImageNet head; 64.74M here);
# the paper uses drop path 0.4 for the large model.
_base_ = './fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py'
model = dict(backbone=dict(arch='pcpvt_large', drop_path_rate=0.4,
                           init_cfg=dict(checkpoint='pcpvt_large')))
