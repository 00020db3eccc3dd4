# pcpvt_tiny classifying the 64 x 64 shape crops (mmpretrain; `python tools/make_shapes.py --classification`
# writes them to data/shapes_cls): the demo's stand-in for ImageNet pretraining. 1,000 iterations of 64 crops
# reach 84.5% top-1 on the 400 held-out crops, 1,200 reach 92.5% (the demo, AMD EPYC, torch 2.14.1).
_base_ = ['mmpretrain::_base_/default_runtime.py', '../_base_/position_no_decay.py']
# the backbones, then two opt-ins: safe and atomic mmengine checkpoints, and RNGStateHook (docs/openmmlab.md)
custom_imports = dict(imports=['cpvt_backbones.adapters.mmpretrain', 'cpvt_backbones.adapters.checkpoint',
                               'cpvt_backbones.adapters.hooks'], allow_failed_imports=False)
# resume draws what an uninterrupted run would; a non-finite loss stops the run, keeping the finite checkpoints
custom_hooks = [dict(type='RNGStateHook'), dict(type='NonFiniteLossHook')]

classes = ('circle', 'square', 'triangle', 'star')
model = dict(
    type='ImageClassifier',
    backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny', out_type='pooled'),
    head=dict(type='LinearClsHead', num_classes=len(classes), in_channels=256,
              loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1)))
data_preprocessor = dict(num_classes=len(classes), mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                         to_rgb=True)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
dataset = dict(type='CustomDataset', data_root='data/shapes_cls', metainfo=dict(classes=classes))
train_dataloader = dict(batch_size=64, num_workers=0, persistent_workers=False,
                        sampler=dict(type='InfiniteSampler', shuffle=True),
                        dataset=dict(dataset, data_prefix='train', pipeline=train_pipeline))
val_dataloader = dict(batch_size=64, num_workers=0, persistent_workers=False,
                      sampler=dict(type='DefaultSampler', shuffle=False),
                      dataset=dict(dataset, data_prefix='val', pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1,))
test_evaluator = val_evaluator

max_iters = 1000
train_cfg = dict(by_epoch=False, max_iters=max_iters, val_interval=max_iters)
val_cfg = dict()
test_cfg = dict()
optim_wrapper = dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05), clip_grad=dict(max_norm=5.0),
                     paramwise_cfg=dict(custom_keys={**_base_.position_no_decay, 'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='CosineAnnealingLR', T_max=max_iters - 30, eta_min=1e-5, by_epoch=False, begin=30, end=max_iters),
]
default_hooks = dict(logger=dict(interval=50), checkpoint=dict(by_epoch=False, interval=max_iters))
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
test_resolutions = [64, 96, 128, 160]
