# Semantic FPN with pcpvt_tiny trained from scratch on the embedded shapes dataset, on CPU
# (python tools/make_shapes.py writes data/shapes). Images keep their own size: no crop, no padding to a
# multiple of 32 beyond what batching needs.
_base_ = ['mmseg::_base_/models/fpn_r50.py', 'mmseg::_base_/default_runtime.py', '../_base_/position_no_decay.py']
# the backbones, then two opt-ins: safe and atomic mmengine checkpoints, and RNGStateHook (docs/openmmlab.md)
custom_imports = dict(imports=['cpvt_backbones.adapters.mmseg', 'cpvt_backbones.adapters.checkpoint',
                               'cpvt_backbones.adapters.hooks'], allow_failed_imports=False)
# resume draws what an uninterrupted run would; a non-finite loss stops the run, keeping the finite checkpoints
custom_hooks = [dict(type='RNGStateHook'), dict(type='NonFiniteLossHook')]

classes = ('background', 'circle', 'square', 'triangle', 'star')
palette = [(0, 0, 0), (230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48)]
data_root = 'data/shapes/'
train_scale = (160, 160)
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    # each image of a padded test batch predicted as it is alone, through any API (docs/reliability.md)
    type='PredictAlone', model_type='EncoderDecoder',
    pretrained=None,
    # pad a batch to its largest image only, handing the backbone each image's size
    data_preprocessor=dict(type='ValidSizeSegDataPreprocessor', size=None, size_divisor=1),
    backbone=dict(_delete_=True, type='PyramidCPVT', arch='pcpvt_tiny', drop_path_rate=0.0),
    neck=dict(in_channels=[32, 64, 160, 256], out_channels=64, num_outs=4),
    decode_head=dict(in_channels=[64, 64, 64, 64], channels=64, dropout_ratio=0.0, num_classes=len(classes),
                     norm_cfg=norm_cfg))
# int8 (tools/test.py --precision int8): the backbone's first stage stays float32. With everything quantized on
# OpenVINO a 1,100-iteration training's mIoU moves by up to 0.006 from float32 at its six test sizes (odd
# aspect); with the whole backbone kept 0.001, with its first stage (blocks.0) kept 0.003, with the FPN, the
# head, the PEGs or the later stages kept 0.005-0.006 (python -m benchmarks.int8_scope --task segmentation;
# docs/performance.md#lower-precision).
int8_keep_fp32 = ['backbone.blocks.0']

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=train_scale, ratio_range=(0.8, 1.2), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=train_scale, keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=dict(classes=classes, palette=palette),
               img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=False)
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False, sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(dataset, data_prefix=dict(img_path='train/images', seg_map_path='train/masks'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False, sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(dataset, data_prefix=dict(img_path='val/images', seg_map_path='val/masks'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

max_iters = 450
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
                     clip_grad=dict(max_norm=10.0),
                     paramwise_cfg=dict(custom_keys={**_base_.position_no_decay, 'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=0., power=0.9, begin=50, end=max_iters, by_epoch=False),
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=250, max_keep_ckpts=2),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
