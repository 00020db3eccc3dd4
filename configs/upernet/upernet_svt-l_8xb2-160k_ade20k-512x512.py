# Twins-SVT-L UperNet, 160k (the SVT-S recipe with the large backbone, drop path 0.3 as mmseg's Twins config).
_base_ = './upernet_svt-s_8xb2-160k_ade20k-512x512.py'
model = dict(backbone=dict(arch=dict(base='svt_large'), drop_path_rate=0.3, init_cfg=dict(checkpoint='svt_large')),
             decode_head=dict(in_channels=[128, 256, 512, 1024]), auxiliary_head=dict(in_channels=512))
