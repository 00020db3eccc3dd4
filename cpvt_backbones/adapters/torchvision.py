"""This package's dense backbones with torchvision's FPN, for torchvision's detectors (``FasterRCNN``, ``MaskRCNN``,
``KeypointRCNN``, ``RetinaNet``, ``FCOS``): ``cpvt_fpn_backbone``, the counterpart of torchvision's
``resnet_fpn_backbone``."""
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torchvision.ops.feature_pyramid_network import ExtraFPNBlock, FeaturePyramidNetwork, LastLevelMaxPool

from ..models.factory import create_model


class BackboneWithFPN(nn.Module):
    """``body`` (a dense backbone: ``forward`` returns a tuple of NCHW maps, ``out_channels`` their channels)
    followed by torchvision's ``FeaturePyramidNetwork``. ``forward(x)`` returns an ``OrderedDict`` of
    ``out_channels``-channel maps keyed '0', '1', ... in the order of ``body``'s maps, then the names
    ``extra_blocks`` adds ('pool' for ``LastLevelMaxPool``, 'p6', 'p7' for ``LastLevelP6P7``), as torchvision's
    own ``BackboneWithFPN`` (the FPN resizes each upper map to the size of the one below it, so ceil-size maps of
    any input size fit). ``out_channels`` is the attribute torchvision's detectors read."""

    def __init__(self, body: nn.Module, out_channels: int = 256, extra_blocks: ExtraFPNBlock | None = None,
                 norm_layer: Callable[..., nn.Module] | None = None):
        super().__init__()
        self.body = body
        self.fpn = FeaturePyramidNetwork(list(body.out_channels), out_channels,
                                         extra_blocks=LastLevelMaxPool() if extra_blocks is None else extra_blocks,
                                         norm_layer=norm_layer)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.fpn(OrderedDict((str(i), f) for i, f in enumerate(self.body(x))))


def cpvt_fpn_backbone(arch: str, pretrained: None | bool | str = None,
                      out_indices: Sequence[int] = (0, 1, 2, 3), out_channels: int = 256,
                      extra_blocks: ExtraFPNBlock | None = None,
                      norm_layer: Callable[..., nn.Module] | None = None, **model_kwargs: Any) -> BackboneWithFPN:
    """A named model of ``cpvt_backbones.list_models()`` as a dense backbone (``create_model(arch,
    features_only=True, out_indices=..., pretrained=..., **model_kwargs)``: the pyramid stages, or a columnar
    model's simple feature pyramid; strides 4, 8, 16, 32 for indices 0-3) with an FPN of ``out_channels``
    channels on the ``out_indices`` levels and ``extra_blocks`` on top (default ``LastLevelMaxPool``: five maps,
    what ``FasterRCNN``'s and ``MaskRCNN``'s default anchors expect; RetinaNet's default anchors expect
    ``out_indices=(1, 2, 3)`` with ``LastLevelP6P7(out_channels, out_channels)``). ``pretrained``: as
    ``create_model`` (True: the published ImageNet weights; a path or URL). ``model_kwargs``: any constructor
    argument (``frozen_stages``, ``drop_path_rate``, ``pos_encoding``)."""
    body = create_model(arch, pretrained=pretrained, features_only=True, out_indices=tuple(out_indices),
                        **model_kwargs)
    return BackboneWithFPN(body, out_channels, extra_blocks, norm_layer)


__all__ = ['BackboneWithFPN', 'cpvt_fpn_backbone']
