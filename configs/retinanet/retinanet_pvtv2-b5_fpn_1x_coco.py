# RetinaNet + FPN with a PVTv2-B5 backbone, COCO 1x, as mmdet ships it
# (configs/pvt/retinanet_pvtv2-b5_fpn_1x_coco.py): AdamW lr 1e-4 / 1.4, wd 1e-4, batch 8 = 8 GPUs x 1 image;
# the rest as B0's.
_base_ = './retinanet_pvtv2-b0_fpn_1x_coco.py'
model = dict(backbone=dict(arch='pvt_v2_b5', init_cfg=dict(checkpoint='pvt_v2_b5')),
             neck=dict(in_channels=[64, 128, 320, 512]))
optim_wrapper = dict(optimizer=dict(lr=1e-4 / 1.4))
train_dataloader = dict(batch_size=1)
auto_scale_lr = dict(base_batch_size=8)
