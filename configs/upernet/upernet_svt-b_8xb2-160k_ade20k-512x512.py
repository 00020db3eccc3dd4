# Twins-SVT-B UperNet, 160k (the SVT-S recipe with the base backbone; drop path 0.2 as mmseg's Twins config).
_base_ = './upernet_svt-s_8xb2-160k_ade20k-512x512.py'
model = dict(backbone=dict(arch=dict(base='svt_base'), init_cfg=dict(checkpoint='svt_base')),
             decode_head=dict(in_channels=[96, 192, 384, 768]), auxiliary_head=dict(in_channels=384))
