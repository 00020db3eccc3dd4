# CPVT-B-GAP (no class token, global average pooling; PEGs after blocks 0-5) on ImageNet-1k, DeiT recipe.
# No paper top-1 for this exact setting.
_base_ = './cpvt-tiny-gap_8xb128_in1k.py'

model = dict(backbone=dict(arch='cpvt_base_gap'), head=dict(in_channels=768))
