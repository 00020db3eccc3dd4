# The DeiT ImageNet-1k recipe (300 epochs, 8 processes x 128 images) shared by the CPVT and PCPVT classification
# configs in configs/imagenet/, which add the backbone and the head width.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
    './position_no_decay.py',
]
# the backbones, then two opt-ins: safe and atomic mmengine checkpoints, and RNGStateHook (docs/openmmlab.md)
custom_imports = dict(imports=['cpvt_backbones.adapters.mmpretrain', 'cpvt_backbones.adapters.checkpoint',
                               'cpvt_backbones.adapters.hooks'], allow_failed_imports=False)
# resume draws what an uninterrupted run would; a non-finite loss stops the run, keeping the finite checkpoints
custom_hooks = [dict(type='RNGStateHook'), dict(type='NonFiniteLossHook')]

# Sizes the evaluation tool tests at without fine-tuning: ResizeEdge(short side round(size / crop_ratio),
# bicubic) + CenterCrop(size). The 224 test pipeline of the dataset base (256 -> 224) is the first of them.
test_resolutions = [224, 384, 448, 512]
crop_ratio = 0.875

model = dict(
    type='ImageClassifier',
    backbone=dict(out_type='pooled', drop_path_rate=0.1),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=.02)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)

# The dataset base's train pipeline is DeiT's: bicubic RandomResizedCrop 224, flip, RandAugment
# (timm_increasing, magnitude 9, std 0.5), RandomErasing 0.25 with per-pixel noise. DeiT's repeated
# augmentation: each image 3 times per epoch, spread over the processes.
train_dataloader = dict(
    batch_size=128,
    sampler=dict(_delete_=True, type='RepeatAugSampler', num_repeats=3, shuffle=True),
)

# lr = 5e-4 x global batch / 512; --auto-scale-lr rescales it from 1024 for other batch sizes.
# No weight decay on the position encodings (the PEGs), the class token, norms, biases and other flat parameters.
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=5e-4 * 1024 / 512, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys=dict(_delete_=True, **_base_.position_no_decay)),
    clip_grad=dict(max_norm=5.0),
)

warmup_epochs = 5
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=warmup_epochs),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
auto_scale_lr = dict(base_batch_size=1024)

default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=3, save_best='auto'))
