# Twins-PCPVT-B (pyramid CPVT, global average pooling) on ImageNet-1k with the DeiT recipe, drop path 0.3.
# Paper top-1: 82.7.
_base_ = './pcpvt-small_8xb128_in1k.py'

model = dict(backbone=dict(arch='pcpvt_base', drop_path_rate=0.3))
