# CPVT-S-GAP (no class token, global average pooling; PEGs after blocks 0-5) on ImageNet-1k, DeiT recipe.
# Paper top-1: 81.5.
_base_ = './cpvt-tiny-gap_8xb128_in1k.py'

model = dict(backbone=dict(arch='cpvt_small_gap'), head=dict(in_channels=384))
