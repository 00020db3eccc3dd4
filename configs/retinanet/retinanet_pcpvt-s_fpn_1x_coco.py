# RetinaNet + FPN with a PCPVT-S backbone, COCO 1x: the Twins paper's setting (43.0 AP, 34.4M params with the
# ImageNet head that the Twins code kept in its backbone; 33.84M here without it).
# The official ImageNet weights are named: fetched once into the cache and checked (cpvt_backbones.convert.hub);
# init_cfg's checkpoint also takes a path or a URL.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', '../_base_/cpvt.py']
# the backbones, then two opt-ins: safe and atomic mmengine checkpoints, and RNGStateHook (docs/openmmlab.md)
custom_imports = dict(imports=['cpvt_backbones.adapters.mmdet', 'cpvt_backbones.adapters.checkpoint',
                               'cpvt_backbones.adapters.hooks'], allow_failed_imports=False)

model = dict(
    # each image of a padded test batch predicted as it is alone, through any API (docs/reliability.md)
    type='PredictAlone', model_type='RetinaNet',
    data_preprocessor=dict(type='ValidSizeDetDataPreprocessor'),  # hands the backbone each image's size
    backbone=_base_.pcpvt_small,
    # start_level=1 and add_extra_convs='on_input' come from the base, as in the paper.
    neck=dict(in_channels=[64, 128, 320, 512]))

# AdamW lr 1e-4, wd 1e-4, 12 epochs, x0.1 at epochs 8 and 11, 500-iter linear warm-up (from the base);
# batch 16 = 8 GPUs x 2 images.
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(base_batch_size=16)
