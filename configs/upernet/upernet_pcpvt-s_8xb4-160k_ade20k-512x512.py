# UperNet with a PCPVT-S backbone on ADE20K 512x512, 160k iterations: mmseg's Twins setting (AdamW lr 6e-5,
# betas 0.9/0.999, wd 0.01 with the position encodings and all norms out of weight decay, 1,500-iteration linear
# warm-up then linear decay to 0, drop path 0.2, an FCN auxiliary head on stage 3 with loss weight 0.4; batch 32
# = 8 GPUs x 4 images). The official ImageNet weights are named: fetched once into the cache and checked.
_base_ = [
    'mmseg::_base_/models/upernet_r50.py', 'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_160k.py',
    '../_base_/position_no_decay.py', '../_base_/cpvt.py'
]
# the backbones, then two opt-ins: safe and atomic mmengine checkpoints, and RNGStateHook (docs/openmmlab.md)
custom_imports = dict(imports=['cpvt_backbones.adapters.mmseg', 'cpvt_backbones.adapters.checkpoint',
                               'cpvt_backbones.adapters.hooks'], allow_failed_imports=False)

crop_size = (512, 512)
model = dict(
    # each image of a padded test batch predicted as it is alone, through any API (docs/reliability.md)
    type='PredictAlone', model_type='EncoderDecoder',
    data_preprocessor=dict(type='ValidSizeSegDataPreprocessor', size=crop_size),  # and each image's size
    pretrained=None,
    backbone=_base_.pcpvt_small,
    decode_head=dict(in_channels=[64, 128, 320, 512], num_classes=150),
    auxiliary_head=dict(in_channels=320, num_classes=150))

optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={**_base_.position_no_decay, 'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0., power=1.0, begin=1500, end=160000, by_epoch=False),
]
train_dataloader = dict(batch_size=4)
