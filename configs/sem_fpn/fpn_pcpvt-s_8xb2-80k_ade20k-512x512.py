# Semantic FPN with a PCPVT-S backbone on ADE20K 512x512: the Twins paper's setting (44.3 mIoU, 28.4M params
# with the stray ImageNet head; 27.86M here). AdamW lr 1e-4, wd 1e-4, poly (power 0.9) over 80k iterations,
# drop path 0.2, batch 16 = 8 GPUs x 2 images. The official ImageNet weights are
# named: fetched once into the cache and checked (cpvt_backbones.convert.hub); a path or a URL works too.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py', 'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_80k.py',
    '../_base_/cpvt.py'
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
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))

optim_wrapper = dict(_delete_=True, type='OptimWrapper',
                     optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4))
# The base's PolyLR floor (eta_min=1e-4) equals this lr and would hold it constant; decay to 0 as in the paper.
param_scheduler = [dict(type='PolyLR', eta_min=0., power=0.9, begin=0, end=80000, by_epoch=False)]
train_dataloader = dict(batch_size=2)
