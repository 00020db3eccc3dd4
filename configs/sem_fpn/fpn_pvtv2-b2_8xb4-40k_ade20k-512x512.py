# Semantic FPN with a PVTv2-B2 backbone on ADE20K 512x512; the recipe as B0's.
_base_ = './fpn_pvtv2-b0_8xb4-40k_ade20k-512x512.py'
model = dict(backbone=dict(arch='pvt_v2_b2', init_cfg=dict(checkpoint='pvt_v2_b2')),
             neck=dict(in_channels=[64, 128, 320, 512]))
