# UperNet with pcpvt_tiny on the embedded shapes dataset, on CPU: the data, schedule, optimiser and backbone of
# the Semantic FPN shapes config (configs/shapes/fpn_pcpvt-tiny_shapes.py); mmseg's UperNet heads (upernet_r50) at
# 64 channels, with the FCN auxiliary head on stage 3 at loss weight 0.4, as mmseg's Twins configs. Images keep
# their own size.
_base_ = ['./fpn_pcpvt-tiny_shapes.py']

num_classes = len(_base_.classes)
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    model_type='EncoderDecoder',
    neck=None,
    decode_head=dict(_delete_=True, type='UPerHead', in_channels=[32, 64, 160, 256], in_index=[0, 1, 2, 3],
                     pool_scales=(1, 2, 3, 6), channels=64, dropout_ratio=0.0, num_classes=num_classes,
                     norm_cfg=norm_cfg, align_corners=False,
                     loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=dict(type='FCNHead', in_channels=160, in_index=2, channels=32, num_convs=1, concat_input=False,
                        dropout_ratio=0.0, num_classes=num_classes, norm_cfg=norm_cfg, align_corners=False,
                        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4)))
