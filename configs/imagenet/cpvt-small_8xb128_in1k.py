# CPVT-S (DeiT-S with PEGs after blocks 0-5, class token) on ImageNet-1k with the DeiT recipe.
# Paper top-1: 80.5 (PEGs at 0-5).
_base_ = './cpvt-tiny_8xb128_in1k.py'

model = dict(backbone=dict(arch='cpvt_small'), head=dict(in_channels=384))
