# CPVT-Ti-GAP (no class token, global average pooling; PEGs after blocks 0-5) on ImageNet-1k, DeiT recipe.
# Paper top-1: 74.9.
_base_ = '../_base_/imagenet_deit.py'

model = dict(backbone=dict(type='CPVT', arch='cpvt_tiny_gap'), head=dict(in_channels=192))
