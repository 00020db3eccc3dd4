# Mask R-CNN + FPN with pcpvt_tiny on the embedded shapes dataset (boxes and instance masks), on CPU: the data,
# optimiser and backbone of the RetinaNet shapes config, 270 iterations (the demo starts the backbone from the one
# pretrained on the shape crops, configs/shapes/pcpvt-tiny_shapes-cls.py); mmdet's Mask R-CNN heads
# (mask-rcnn_r50_fpn) at the FPN's width, 64 channels, sized for 1-3 objects an image on a CPU: 64 RoIs sampled per
# image instead of 512 (up to 16 positives train the mask head), 1000 proposals kept before NMS and 150 after in
# training (300 in testing).
# No padding to a multiple of 32: the backbone takes any size.
_base_ = ['./retinanet_pcpvt-tiny_fpn_shapes.py']

num_classes = len(_base_.classes)
box_coder = dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.], target_stds=[1., 1., 1., 1.])
roi_layer = dict(type='RoIAlign', sampling_ratio=2)
nms = dict(type='nms', iou_threshold=0.7)
model = dict(
    _delete_=True, type='PredictAlone', model_type='MaskRCNN',
    data_preprocessor=dict(_base_.model.data_preprocessor, pad_mask=True),
    backbone=_base_.model.backbone,
    neck=dict(type='FPN', in_channels=[32, 64, 160, 256], out_channels=64, num_outs=5),
    rpn_head=dict(type='RPNHead', in_channels=64, feat_channels=64,
                  anchor_generator=dict(type='AnchorGenerator', scales=[8], ratios=[0.5, 1.0, 2.0],
                                        strides=[4, 8, 16, 32, 64]),
                  bbox_coder=box_coder, loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0),
                  loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
    roi_head=dict(
        type='StandardRoIHead',
        bbox_roi_extractor=dict(type='SingleRoIExtractor', roi_layer=dict(roi_layer, output_size=7), out_channels=64,
                                featmap_strides=[4, 8, 16, 32]),
        bbox_head=dict(type='Shared2FCBBoxHead', in_channels=64, fc_out_channels=256, roi_feat_size=7,
                       num_classes=num_classes, reg_class_agnostic=False,
                       bbox_coder=dict(box_coder, target_stds=[0.1, 0.1, 0.2, 0.2]),
                       loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                       loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
        mask_roi_extractor=dict(type='SingleRoIExtractor', roi_layer=dict(roi_layer, output_size=14), out_channels=64,
                                featmap_strides=[4, 8, 16, 32]),
        mask_head=dict(type='FCNMaskHead', num_convs=4, in_channels=64, conv_out_channels=64, num_classes=num_classes,
                       loss_mask=dict(type='CrossEntropyLoss', use_mask=True, loss_weight=1.0))),
    train_cfg=dict(
        rpn=dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.7, neg_iou_thr=0.3, min_pos_iou=0.3,
                               match_low_quality=True, ignore_iof_thr=-1),
                 sampler=dict(type='RandomSampler', num=256, pos_fraction=0.5, neg_pos_ub=-1,
                              add_gt_as_proposals=False),
                 allowed_border=-1, pos_weight=-1, debug=False),
        rpn_proposal=dict(nms_pre=1000, max_per_img=150, nms=nms, min_bbox_size=0),
        rcnn=dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.5, min_pos_iou=0.5,
                                match_low_quality=True, ignore_iof_thr=-1),
                  sampler=dict(type='RandomSampler', num=64, pos_fraction=0.25, neg_pos_ub=-1,
                               add_gt_as_proposals=True),
                  mask_size=28, pos_weight=-1, debug=False)),
    test_cfg=dict(rpn=dict(nms_pre=1000, max_per_img=300, nms=nms, min_bbox_size=0),
                  rcnn=dict(score_thr=0.05, nms=dict(type='nms', iou_threshold=0.5), max_per_img=50,
                            mask_thr_binary=0.5)))
# int8 (tools/test.py --precision int8): the FPN and the heads stay float32, as RetinaNet's.
int8_keep_fp32 = ['neck', 'rpn_head', 'roi_head']

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=_base_.train_scale, ratio_range=(0.8, 1.2), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=_base_.train_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(metric=['bbox', 'segm'])
test_evaluator = val_evaluator

max_iters = 270
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', T_max=max_iters, eta_min=1e-5, by_epoch=False, begin=0, end=max_iters),
]
