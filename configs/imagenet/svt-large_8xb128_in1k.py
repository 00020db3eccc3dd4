# Twins-SVT-L on ImageNet-1k with the DeiT recipe, drop path 0.5. Paper top-1: 83.7.
_base_ = './svt-small_8xb128_in1k.py'

model = dict(backbone=dict(arch='svt_large', drop_path_rate=0.5), head=dict(in_channels=1024))
