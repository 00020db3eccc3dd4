# Twins-PCPVT-S (pyramid CPVT, global average pooling) on ImageNet-1k with the DeiT recipe, drop path 0.2.
# Paper top-1: 81.2.
_base_ = '../_base_/imagenet_deit.py'

model = dict(backbone=dict(type='PyramidCPVT', arch='pcpvt_small', drop_path_rate=0.2), head=dict(in_channels=512))
