# Semantic FPN with a PVTv2-B0 backbone on ADE20K 512x512, as the PVTv2 release trained it (its
# configs/sem_fpn/PVTv2/fpn_pvtv2_b*_ade20k_40k.py): AdamW lr 2e-4, wd 1e-4, poly (power 0.9) to 0 over 40k
# iterations, batch 32 = 8 GPUs x 4 images, drop path 0.1; B1 and B2 start from this file. The ImageNet weights are
# named: fetched once into the cache and checked (cpvt_backbones.convert.hub); a path or a URL works too.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py', 'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_40k.py',
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
    backbone=dict(_delete_=True, type='PVTv2', arch='pvt_v2_b0', out_indices=(0, 1, 2, 3), drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='pvt_v2_b0')),
    neck=dict(in_channels=[32, 64, 160, 256], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))

optim_wrapper = dict(_delete_=True, type='OptimWrapper',
                     optimizer=dict(type='AdamW', lr=2e-4, weight_decay=1e-4))
# The base's PolyLR floor (eta_min=1e-4) would hold the lr near constant; decay to 0 as the release does.
param_scheduler = [dict(type='PolyLR', eta_min=0., power=0.9, begin=0, end=40000, by_epoch=False)]
train_dataloader = dict(batch_size=4)
