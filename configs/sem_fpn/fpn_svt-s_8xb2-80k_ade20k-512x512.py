# Semantic FPN with a Twins-SVT-S backbone on ADE20K 512x512: the PCPVT-S recipe (AdamW lr 1e-4, wd 1e-4, poly
# over 80k iterations, drop path 0.2, batch 16) with the SVT-S backbone, whose windowed attention masks the tokens
# that pad a map to whole 7 x 7 windows (window_mask, the Twins release's dense code).
_base_ = './fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py'
model = dict(
    backbone=_base_.svt_small,
    neck=dict(in_channels=[64, 128, 256, 512]))
