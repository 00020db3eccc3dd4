# CPVT-B (DeiT-B with PEGs after blocks 0-5, class token) on ImageNet-1k with the DeiT recipe.
# No paper top-1 for this exact setting.
_base_ = './cpvt-tiny_8xb128_in1k.py'

model = dict(backbone=dict(arch='cpvt_base'), head=dict(in_channels=768))
