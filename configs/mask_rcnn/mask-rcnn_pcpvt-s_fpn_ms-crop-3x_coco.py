# Mask R-CNN + FPN with a PCPVT-S backbone, COCO 3x with multi-scale training: the Twins release's Swin setting.
# DETR-style augmentation (short side 480-800, max 1333, or resize-crop-resize), AdamW lr 1e-4, wd 0.05 with the
# position encodings and all norms out of weight decay, 36 epochs, x0.1 at 27 and 33. The release trained in
# mixed precision (loss scale 512); mmdet's tools/train.py --amp does the same here.
_base_ = ['./mask-rcnn_pcpvt-s_fpn_1x_coco.py', '../_base_/position_no_decay.py']

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize',
                  scales=[(1333, s) for s in range(480, 801, 32)], keep_ratio=True)],
            [dict(type='RandomChoiceResize', scales=[(1333, 400), (1333, 500), (1333, 600)], keep_ratio=True),
             dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600), allow_negative_crop=True),
             dict(type='RandomChoiceResize',
                  scales=[(1333, s) for s in range(480, 801, 32)], keep_ratio=True)],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
optim_wrapper = dict(
    optimizer=dict(lr=1e-4, weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={**_base_.position_no_decay, 'norm': dict(decay_mult=0.)}))
