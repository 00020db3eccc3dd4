# Twins-SVT-B on ImageNet-1k with the DeiT recipe, drop path 0.3. Paper top-1: 83.2.
_base_ = './svt-small_8xb128_in1k.py'

model = dict(backbone=dict(arch='svt_base', drop_path_rate=0.3), head=dict(in_channels=768))
