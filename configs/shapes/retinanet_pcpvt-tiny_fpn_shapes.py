# RetinaNet + FPN with pcpvt_tiny on the embedded shapes dataset, on CPU (from scratch here; the demo starts it
# from the backbone pretrained on the shape crops, configs/shapes/pcpvt-tiny_shapes-cls.py)
# (python tools/make_shapes.py writes data/shapes). No padding to a multiple of 32: the backbone takes any
# size, so the detector trains and predicts on images as they are.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', '../_base_/position_no_decay.py']
# the backbones, then two opt-ins: safe and atomic mmengine checkpoints, and RNGStateHook (docs/openmmlab.md)
custom_imports = dict(imports=['cpvt_backbones.adapters.mmdet', 'cpvt_backbones.adapters.checkpoint',
                               'cpvt_backbones.adapters.hooks'], allow_failed_imports=False)
# resume draws what an uninterrupted run would; a non-finite loss stops the run, keeping the finite checkpoints
custom_hooks = [dict(type='RNGStateHook'), dict(type='NonFiniteLossHook')]

classes = ('circle', 'square', 'triangle', 'star')
data_root = 'data/shapes/'
train_scale = (192, 192)

model = dict(
    # each image of a padded test batch predicted as it is alone, through any API (docs/reliability.md)
    type='PredictAlone', model_type='RetinaNet',
    # pad a batch to its largest image only, handing the backbone each image's size
    data_preprocessor=dict(type='ValidSizeDetDataPreprocessor', pad_size_divisor=1),
    backbone=dict(_delete_=True, type='PyramidCPVT', arch='pcpvt_tiny', drop_path_rate=0.0),
    neck=dict(in_channels=[32, 64, 160, 256], out_channels=64),
    # Anchors for the data: the shapes span 21-96 px at the training scale, and RetinaNet's default smallest
    # anchor (4 x stride 8 = 32 px) leaves the smallest below the 0.5 IoU a positive needs; 3 x stride gives
    # 24-38 px at stride 8 up to 96-152 px at stride 32.
    bbox_head=dict(num_classes=len(classes), in_channels=64, feat_channels=64, stacked_convs=2,
                   anchor_generator=dict(octave_base_scale=3),
                   norm_cfg=dict(type='GN', num_groups=16, requires_grad=True),
                   reg_decoded_bbox=True, loss_bbox=dict(_delete_=True, type='GIoULoss', loss_weight=2.0)),
    test_cfg=dict(score_thr=0.05, max_per_img=50))
# int8 (tools/test.py --precision int8): the FPN and the head stay float32. With everything quantized on OpenVINO
# a 700-iteration training's bbox mAP moves by up to 0.022 from float32 at its six test sizes; with the head
# alone kept 0.007, with the FPN and the head kept 0.003 (python -m benchmarks.int8_scope;
# docs/performance.md#lower-precision).
int8_keep_fp32 = ['neck', 'bbox_head']

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomResize', scale=train_scale, ratio_range=(0.8, 1.2), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=train_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
dataset = dict(type='CocoDataset', data_root=data_root, metainfo=dict(classes=classes))
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False, batch_sampler=None,
    sampler=dict(type='InfiniteSampler', shuffle=True),  # mmengine sleeps 2 s at every epoch end otherwise
    dataset=dict(dataset, ann_file='annotations/train.json', data_prefix=dict(img='train/images/'),
                 filter_cfg=dict(filter_empty_gt=True), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(dataset, ann_file='annotations/val.json', data_prefix=dict(img='val/images/'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator

max_iters = 500
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-3, weight_decay=0.05),
                     clip_grad=dict(max_norm=10.0),
                     paramwise_cfg=dict(custom_keys={**_base_.position_no_decay, 'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='CosineAnnealingLR', T_max=max_iters, eta_min=1e-5, by_epoch=False, begin=0, end=max_iters),
]
default_hooks = dict(logger=dict(interval=50),
                     checkpoint=dict(by_epoch=False, interval=250, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=8)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
