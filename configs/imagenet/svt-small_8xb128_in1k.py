# Twins-SVT-S (windowed and global sub-sampled attention in turn, PEGs, global average pooling) on ImageNet-1k with
# the DeiT recipe, drop path 0.2. Paper top-1: 81.7. Windows pad without masking (timm's behaviour).
_base_ = '../_base_/imagenet_deit.py'

model = dict(backbone=dict(type='TwinsSVT', arch='svt_small', drop_path_rate=0.2), head=dict(in_channels=512))
