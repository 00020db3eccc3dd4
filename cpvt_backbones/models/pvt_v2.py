"""PVTv2 (Wang et al., arXiv 2106.13797) on the pyramid trunk; its checkpoint layouts (timm, the official release,
mmdet), its named sizes and their published weights."""
import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch

from ..convert.hub import PRETRAINED, WeightSource
from ..convert.layouts import LINEAR_AS_CONV1X1, QKV, Layout, StateDict, apply_rules, inverted, register_layout
from ..layers import ConvMlp
from .base import Stage, per_stage
from .pcpvt import Pyramid


class PVTv2(Pyramid):
    """PVTv2: a ``Pyramid`` (all said there holds) whose stages embed with overlapping patches (7 x 7 at stride 4,
    then 3 x 3 at stride 2), run a convolutional feed-forward in every block (``layers.ConvMlp``), reduce keys and
    values by a strided convolution without padding (``reduction='drop'``), or with ``linear=True`` by pooling to
    7 x 7 (PVTv2-li, whose feed-forward also has a ReLU before its convolution), and norm each stage's output
    (``norms.{i}``, what the next stage and the outputs see). No position encoding by default (``pos_encoding``
    takes any, as ``PyramidCPVT``'s). Native keys ``patch_embeds.{i}``, ``blocks.{i}.{j}``
    (``attn.q/kv/sr/norm/proj``, ``mlp.fc1/dwconv/fc2``), ``norms.{i}``, ``head``; timm's ``pvt_v2_*``, the
    official release's and mmdet's ``PyramidVisionTransformerV2`` keys load through ``convert`` (registered
    layouts 'pvt_v2_timm', 'pvt_v2_official', 'pvt_v2_mmdet')."""

    def __init__(
        self,
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        depths: Sequence[int] = (3, 4, 6, 3),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8, 8, 4, 4),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        linear: bool = False,
        pos_encoding: Any = 'none',
        **kwargs: Any,
    ):
        """
        Args:
            embed_dims: width of each stage's tokens.
            depths: blocks of each stage.
            num_heads: attention heads of each stage's blocks.
            mlp_ratios: feed-forward hidden width over the stage's width.
            sr_ratios: how many times each stage's attention reduces the key/value map per side (ignored with
                ``linear``).
            linear: PVTv2-li: keys and values pooled to 7 x 7 at every stage, a ReLU in the feed-forward.
            pos_encoding: position encodings on top (``cpvt_backbones.layers.position``); 'none' as PVTv2.
            **kwargs: ``Pyramid``'s ``frozen_stages`` and ``CPVTBase``'s arguments.
        """
        mlp = partial(ConvMlp, extra_relu=linear)
        rows = per_stage(embed_dims=embed_dims, depths=depths, num_heads=num_heads, mlp_ratios=mlp_ratios,
                         sr_ratios=sr_ratios)
        stages = tuple(Stage(dim=d, depth=n, num_heads=h, mlp_ratio=r, patch_size=4 if i == 0 else 2,
                             embed_kernel=7 if i == 0 else 3, sr_ratio=sr, reduction='pool' if linear else 'drop',
                             mlp_layer=mlp, norm=True)
                       for i, (d, n, h, r, sr) in enumerate(rows))
        super().__init__(stages, pos_encoding=pos_encoding, **kwargs)


# Named sizes (timm's pvt_v2_b0 ... b5, b2_li): settings for ``models.factory``.
_WIDE = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8))
SIZES: dict[str, dict[str, Any]] = {
    'pvt_v2_b0': dict(embed_dims=(32, 64, 160, 256), num_heads=(1, 2, 5, 8), depths=(2, 2, 2, 2)),
    'pvt_v2_b1': dict(_WIDE, depths=(2, 2, 2, 2)),
    'pvt_v2_b2': dict(_WIDE, depths=(3, 4, 6, 3)),
    'pvt_v2_b2_li': dict(_WIDE, depths=(3, 4, 6, 3), linear=True),
    'pvt_v2_b3': dict(_WIDE, depths=(3, 4, 18, 3)),
    'pvt_v2_b4': dict(_WIDE, depths=(3, 8, 27, 3)),
    'pvt_v2_b5': dict(_WIDE, depths=(3, 6, 40, 3), mlp_ratios=(4, 4, 4, 4)),
}

# (native, timm) for timm's ``pvt_v2_*``: the first embedding is ``patch_embed``, the others each stage's
# ``downsample``; blocks and the stage norms live in ``stages.{i}``.
_BLOCK = ('norm1', 'norm2', 'attn.q', 'attn.kv', 'attn.sr', 'attn.norm', 'attn.proj', 'mlp.fc1', 'mlp.dwconv',
          'mlp.fc2')
_TIMM = [('patch_embeds.0.{rest}', 'patch_embed.{rest}'),
         ('patch_embeds.{i}.{rest}', 'stages.{i}.downsample.{rest}'),
         ('blocks.{i}.{j}.{rest}', 'stages.{i}.blocks.{j}.{rest}'),
         ('norms.{i}.{p}', 'stages.{i}.norm.{p}'),
         ('head.{p}', 'head.{p}')]
# (native, official release): stages numbered from 1, ``mlp.dwconv.dwconv``.
_OFFICIAL = [('blocks.{i}.{j}.mlp.dwconv.{p}', 'block{k}.{j}.mlp.dwconv.dwconv.{p}'),
             ('patch_embeds.{i}.{rest}', 'patch_embed{k}.{rest}'),
             ('blocks.{i}.{j}.{rest}', 'block{k}.{j}.{rest}'),
             ('norms.{i}.{p}', 'norm{k}.{p}'),
             ('head.{p}', 'head.{p}')]
# (native, mmdet ``PyramidVisionTransformerV2``): ``layers.{i}`` holds (patch embedding, blocks, norm); q and kv
# are one ``nn.MultiheadAttention``, the feed-forward's linear layers 1 x 1 convolutions.
_MMDET = [('patch_embeds.{i}.proj.{p}', 'layers.{i}.0.projection.{p}'),
          ('patch_embeds.{i}.norm.{p}', 'layers.{i}.0.norm.{p}'),
          ('blocks.{i}.{j}.attn.{part}.{p}', 'layers.{i}.1.{j}.attn.attn.in_proj_{p}', QKV),
          ('blocks.{i}.{j}.attn.proj.{p}', 'layers.{i}.1.{j}.attn.attn.out_proj.{p}'),
          ('blocks.{i}.{j}.mlp.fc1.weight', 'layers.{i}.1.{j}.ffn.layers.0.weight', LINEAR_AS_CONV1X1),
          ('blocks.{i}.{j}.mlp.fc1.bias', 'layers.{i}.1.{j}.ffn.layers.0.bias'),
          ('blocks.{i}.{j}.mlp.dwconv.{p}', 'layers.{i}.1.{j}.ffn.layers.1.{p}'),
          ('blocks.{i}.{j}.mlp.fc2.weight', 'layers.{i}.1.{j}.ffn.layers.4.weight', LINEAR_AS_CONV1X1),
          ('blocks.{i}.{j}.mlp.fc2.bias', 'layers.{i}.1.{j}.ffn.layers.4.bias'),
          ('norms.{i}.{p}', 'layers.{i}.2.{p}')] + [
    (f'blocks.{{i}}.{{j}}.{m}.{{p}}', f'layers.{{i}}.1.{{j}}.{m}.{{p}}')
    for m in ('norm1', 'norm2', 'attn.sr', 'attn.norm')]
_STAGE_FROM_1 = re.compile(r'^(patch_embed|block|norm)(\d)(?=\.)')


def _renumbered(state_dict: Mapping[str, torch.Tensor], step: int) -> StateDict:
    """Official keys with their stage numbers moved by ``step`` (1-based <-> 0-based, as ``{k}`` = i + 1)."""
    return {_STAGE_FROM_1.sub(lambda m: f'{m.group(1)}{int(m.group(2)) + step}', k): v for k, v in state_dict.items()}


def timm_to_native(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """timm's ``pvt_v2_*`` keys -> native."""
    return apply_rules(state_dict, inverted(_TIMM), 'timm PVTv2')


def native_to_timm(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Native PVTv2 keys -> timm's ``pvt_v2_*``."""
    return apply_rules(state_dict, _TIMM, 'our PVTv2')


def official_to_native(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """The official PVTv2 release's keys (``patch_embed1``, ``block1.0``, ``norm1``, ...) -> native."""
    rules = [(target.replace('{k}', '{i}'), source) for source, target in _OFFICIAL]
    return apply_rules(_renumbered(state_dict, -1), rules, 'official PVTv2')


def mmdet_to_native(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """mmdet 3.x ``PyramidVisionTransformerV2`` backbone keys -> native (mmdet's backbone keeps no head)."""
    return apply_rules(state_dict, inverted(_MMDET), 'mmdet PyramidVisionTransformerV2')


def native_to_mmdet(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Native PVTv2 keys -> mmdet 3.x ``PyramidVisionTransformerV2``; a classifier head has no place there and is
    left out."""
    return apply_rules(state_dict, [('head.{rest}', None)] + _MMDET, 'our PVTv2')


def _matches(pattern: str):
    compiled = re.compile(pattern)
    return lambda keys: any(compiled.match(k) for k in keys)


register_layout('pvt_v2_timm', Layout(_matches(r'stages\.\d+\.(blocks|downsample)\.'), timm_to_native,
                                      native_to_timm))
register_layout('pvt_v2_official', Layout(_matches(r'(block|patch_embed)[1-9]\.'), official_to_native))
register_layout('pvt_v2_mmdet', Layout(_matches(r'layers\.\d+\.1\.\d+\.ffn\.layers\.\d\.'), mmdet_to_native,
                                       native_to_mmdet))

# Published ImageNet weights by name (``create_model(name, pretrained=True)``, ``init_cfg`` checkpoints): timm's
# hub copy, then the official release.
PRETRAINED.update({name: (
    WeightSource(f'https://huggingface.co/timm/{name}.in1k/resolve/main/model.safetensors', f'{name}.in1k.safetensors',
                 'pvt_v2_timm', note="timm's hub file"),
    WeightSource(f'https://github.com/whai362/PVT/releases/download/v2/{name}.pth', f'{name}.pth', 'pvt_v2_official',
                 note='the official PVTv2 release')) for name in SIZES})

__all__ = ['PVTv2', 'SIZES', 'mmdet_to_native', 'native_to_mmdet', 'native_to_timm', 'official_to_native',
           'timm_to_native']
