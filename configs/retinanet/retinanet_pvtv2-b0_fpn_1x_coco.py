# RetinaNet + FPN with a PVTv2-B0 backbone, COCO 1x, as mmdet ships it (configs/pvt/retinanet_pvtv2-b0_fpn_1x_coco.py:
# AdamW lr 1e-4, wd 1e-4, drop path 0.1, batch 16 = 8 GPUs x 2 images); B1-B5 start from this file. The backbone is
# this package's PVTv2 (mmdet's PyramidVisionTransformerV2 checkpoints load into it): each image of a padded batch
# as alone. The ImageNet weights are named: fetched once into the cache and checked (cpvt_backbones.convert.hub);
# init_cfg's checkpoint also takes a path or a URL.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', '../_base_/cpvt.py']
# the backbones, then two opt-ins: safe and atomic mmengine checkpoints, and RNGStateHook (docs/openmmlab.md)
custom_imports = dict(imports=['cpvt_backbones.adapters.mmdet', 'cpvt_backbones.adapters.checkpoint',
                               'cpvt_backbones.adapters.hooks'], allow_failed_imports=False)

model = dict(
    # each image of a padded test batch predicted as it is alone, through any API (docs/reliability.md)
    type='PredictAlone', model_type='RetinaNet',
    data_preprocessor=dict(type='ValidSizeDetDataPreprocessor'),  # hands the backbone each image's size
    backbone=dict(_delete_=True, type='PVTv2', arch='pvt_v2_b0', out_indices=(0, 1, 2, 3), drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='pvt_v2_b0')),
    # start_level=1 and add_extra_convs='on_input' come from the base, as mmdet's PVT configs
    neck=dict(in_channels=[32, 64, 160, 256]))

optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(base_batch_size=16)
