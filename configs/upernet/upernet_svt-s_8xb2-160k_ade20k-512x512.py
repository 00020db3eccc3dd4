# UperNet with a Twins-SVT-S backbone on ADE20K 512x512, 160k: the PCPVT-S recipe (mmseg's Twins setting) with the
# SVT-S backbone (windowed attention masking the tokens that pad a map to whole windows: window_mask, the Twins
# release's dense code); batch 16 = 8 GPUs x 2 images, drop path 0.2.
_base_ = './upernet_pcpvt-s_8xb4-160k_ade20k-512x512.py'
model = dict(
    backbone=_base_.svt_small,
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
train_dataloader = dict(batch_size=2)
