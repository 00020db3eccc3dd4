# Twins-PCPVT-L (pyramid CPVT, global average pooling) on ImageNet-1k with the DeiT recipe, drop path 0.5.
# Paper top-1: 83.1.
_base_ = './pcpvt-small_8xb128_in1k.py'

model = dict(backbone=dict(arch='pcpvt_large', drop_path_rate=0.5))
