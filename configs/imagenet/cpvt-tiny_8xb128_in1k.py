# CPVT-Ti (DeiT-Ti with PEGs after blocks 0-5, class token) on ImageNet-1k with the DeiT recipe.
# Paper top-1: 72.4 with one PEG at block 0, 73.4 with PEGs at 0-5 (this config).
_base_ = '../_base_/imagenet_deit.py'

model = dict(backbone=dict(type='CPVT', arch='cpvt_tiny'), head=dict(in_channels=192))
