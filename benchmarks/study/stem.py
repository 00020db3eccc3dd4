"""A convolutional stem every variant of a study can share in place of its patch embedding.

``ConvStem`` halves the image per layer with 3 x 3 convolutions of stride 2 (GELU between them), so that
``log2(patch)`` layers give the patch embedding's stride and token grid (optionally with BatchNorm after every
convolution, as Xiao et al.'s convolutional stems for ViTs have it). Its padding is circular: the stem adds
locality to every variant without giving any of them a zero border to read absolute position from, so that what
tells the variants apart is still only their position encoding. ``Stemmed`` runs a network on the stem's map and
has the calls a study makes of a model (``forward``, ``forward_features``, ``num_prefix_tokens``,
``no_weight_decay``)."""
import math

import torch
from torch import nn


class ConvStem(nn.Sequential):
    """``layers = log2(patch)`` stride-2 3 x 3 convolutions (circular padding) from ``in_chans`` to ``dim``
    channels, widths doubling up to ``dim``, then ``extra`` 3 x 3 stride-1 convolutions of ``dim`` channels
    (circular padding: a wider receptive field, still no border), GELU between every two; with ``norm`` a
    BatchNorm after every convolution (per-channel statistics over the batch and the whole map: no position
    either); the map is ceil(H / patch) x ceil(W / patch)."""

    def __init__(self, in_chans: int, dim: int, patch: int, extra: int = 0, norm: bool = False):
        layers = round(math.log2(patch))
        if patch < 2 or 2 ** layers != patch:
            raise ValueError(f'ConvStem needs a patch size 2, 4, 8, ..., got {patch}')
        if extra < 0:
            raise ValueError(f'ConvStem\'s extra layers must be >= 0, got {extra}')
        widths = [max(dim >> (layers - 1 - i), 1) for i in range(layers)]
        convs = [nn.Conv2d(widths[i - 1] if i else in_chans, width, 3, 2, 1, padding_mode='circular')
                 for i, width in enumerate(widths)]
        convs += [nn.Conv2d(dim, dim, 3, 1, 1, padding_mode='circular') for _ in range(extra)]
        modules: list[nn.Module] = []
        for i, conv in enumerate(convs):
            if i:
                modules.append(nn.GELU())
            modules.append(conv)
            if norm:
                modules.append(nn.BatchNorm2d(conv.out_channels))
        super().__init__(*modules)


class Stemmed(nn.Module):
    """``net`` (built with ``in_chans = dim`` and patch size 1) on the map of ``stem``."""

    def __init__(self, stem: nn.Module, net: nn.Module):
        super().__init__()
        self.stem, self.net = stem, net
        self.num_prefix_tokens = getattr(net, 'num_prefix_tokens', 0)

    def no_weight_decay(self) -> set[str]:
        return {f'net.{name}' for name in self.net.no_weight_decay()}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.forward_features(self.stem(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.stem(x))
