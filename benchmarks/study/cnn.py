"""The resolution study's positive control: a convolutional network on the ViT's token grid with no position
encoding at all, so that what a change of test size does to it is what the protocol does to any network.

``PatchCNN`` keeps the study ViT's shape: a patch embedding (a ``patch`` x ``patch`` convolution of stride
``patch``), ``depth`` residual blocks at that one resolution, global average pooling and a linear head. Each
block is ConvMixer's (Trockman and Kolter, 2022): a depthwise ``kernel_size`` convolution (zero padding), GELU
and BatchNorm added back to its input, then a pointwise convolution, GELU and BatchNorm. It has the calls the
study makes of a model: ``forward`` (logits), ``forward_features`` (B, N, C tokens for the position probe, no
prefix tokens) and ``no_weight_decay`` (nothing is exempt beyond biases and norms, which the optimizer exempts by
shape)."""

import torch
from torch import nn


class _Residual(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


class PatchCNN(nn.Module):
    num_prefix_tokens = 0

    def __init__(self, dim: int, depth: int, patch: int, in_chans: int = 1, num_classes: int = 10,
                 kernel_size: int = 5):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f'kernel_size must be odd (same-size zero padding), got {kernel_size}')
        self.patch_embed = nn.Sequential(nn.Conv2d(in_chans, dim, patch, stride=patch), nn.GELU(), nn.BatchNorm2d(dim))
        self.blocks = nn.Sequential(*(nn.Sequential(
            _Residual(nn.Sequential(nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim),
                                    nn.GELU(), nn.BatchNorm2d(dim))),
            nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim)) for _ in range(depth)))
        self.head = nn.Linear(dim, num_classes)

    def no_weight_decay(self) -> set[str]:
        return set()

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.patch_embed(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.feature_map(x).flatten(2).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.feature_map(x).mean(dim=(2, 3)))
