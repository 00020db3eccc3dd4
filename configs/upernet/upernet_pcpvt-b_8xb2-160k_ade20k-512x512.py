# PCPVT-B UperNet, 160k (mmseg's Twins setting: drop path 0.3, batch 16 = 8 GPUs x 2 images).
_base_ = './upernet_pcpvt-s_8xb4-160k_ade20k-512x512.py'
model = dict(backbone=dict(arch='pcpvt_base', drop_path_rate=0.3, init_cfg=dict(checkpoint='pcpvt_base')))
train_dataloader = dict(batch_size=2)
