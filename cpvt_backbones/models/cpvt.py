"""Columnar (DeiT-style) CPVT: a plain ViT whose position encoding is a part of its own, by default PEGs."""
from types import MappingProxyType
from typing import Any, Callable, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import Attention, Block, Geometry, LayerNorm2d, Mlp, PatchEmbed, tokens_to_map
from .base import CPVTBase, take_indices

PYRAMID_STRIDES = (4, 8, 16, 32)


class CeilMaxPool(nn.Module):
    """2 x 2 max pooling to ceil(H / 2) x ceil(W / 2) rows and columns: one row and column of -inf appended,
    then pooled without ceil mode. The result of ``nn.MaxPool2d(2, 2, ceil_mode=True)``, in a form every engine
    takes down to a 1 x 1 map and with no shape arithmetic (OpenVINO's pooling refuses a window larger than its
    input, and its converter has no rule for an exported model's symbolic ``%``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float('-inf')), 2, 2)


def _simple_pyramid_level(level: int, dim: int) -> nn.Module:
    """ViTDet's simple feature pyramid: from the stride-16 map, two 2x deconvolutions give stride 4, one gives
    stride 8, identity stride 16, 2x max-pooling stride 32 (ceil mode, so ceil(H / 32) rows)."""
    if level == 0:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, 2), LayerNorm2d(dim // 2, eps=1e-6), nn.GELU(),
                             nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2))
    if level == 1:
        return nn.ConvTranspose2d(dim, dim // 2, 2, 2)
    if level == 2:
        return nn.Identity()
    return CeilMaxPool()


class CPVT(CPVTBase):
    """DeiT-style vision transformer with conditional positional encodings (CPVT, arXiv 2102.10882).

    There is no position table: by default ``pos_block.{k}`` is the k-th PEG, after blocks 0-5 (the paper's
    best; ``peg_after[(0, j)] = k``). ``pos_encoding`` chooses any other (``cpvt_backbones.layers.position``):
    ``dict(type='peg', positions=(0,))`` (the paper's default), ``'learned'`` (DeiT's table for a 224 px
    input, resized to any other), ``'sincos'``, ``'rpe'``, ``'rope_axial'``, ``'rope_mixed'``, ``'none'``, the
    controls ``'conv1x1'``, ``'peg_qk'`` and ``dict(type='peg', frozen=True)``, or combinations
    (``'learned+peg'``). ``layer_scale_init`` adds CaiT's layer scale to every block (timm's RoPE ViTs use
    1e-5); ``attn_layer``, ``mlp_layer`` and ``norm_layer`` are the blocks' parts (``layers.Block``).
    ``class_token=False`` is the GAP variant (average of the normed patch tokens, > 1 point better
    top-1 in the paper). The patch embedding is DeiT's (a convolution, no norm).

    ``features_only=True`` turns it into a dense backbone: the normed stride-16 patch tokens are laid out as
    a map and a ViTDet-style simple feature pyramid makes maps at strides 4, 8, 16, 32 with dim/4, dim/2,
    dim, dim channels and spatial size ceil(H / s) x ceil(W / s) (upsampled maps are cropped to that size;
    the rows they drop come from padding). Only the levels in ``out_indices`` are built.
    ``frozen_stages=k`` freezes the patch embedding, class token and position table for k = 0 and also
    blocks 0..k-1 and their position-encoding parts (the PEGs after them, their RoPE frequencies or relative
    biases) for k >= 1. ``check_finite=True`` makes forward raise a ValueError on NaN or Inf inputs (off by
    default: a pass over the input).
    """

    def __init__(
        self,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        class_token: bool = True,
        qkv_bias: bool = True,
        drop_rate: float = 0.,
        attn_drop_rate: float = 0.,
        drop_path_rate: float = 0.,
        norm_eps: float = 1e-6,
        pos_encoding: Any = MappingProxyType(dict(type='peg', positions=(0, 1, 2, 3, 4, 5))),
        layer_scale_init: Optional[float] = None,
        attn_layer: Callable[..., nn.Module] = Attention,
        mlp_layer: Callable[..., nn.Module] = Mlp,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        features_only: bool = False,
        out_indices: Optional[Sequence[int]] = None,
        frozen_stages: int = -1,
        grad_checkpointing: bool = False,
        check_finite: bool = False,
    ):
        super().__init__()
        self._setup_outputs(features_only, num_classes, out_indices, len(PYRAMID_STRIDES))
        if features_only and patch_size != 16:
            raise ValueError(f'the simple feature pyramid is built on stride-16 tokens, got patch_size {patch_size}')
        if not -1 <= frozen_stages <= depth:
            raise ValueError(f'frozen_stages must be within -1..{depth} (blocks), got {frozen_stages}')

        self.in_chans = in_chans
        self.check_finite = check_finite
        self.embed_dim = embed_dim
        self.num_prefix_tokens = int(class_token)
        self.strides = tuple(PYRAMID_STRIDES[i] for i in self.out_indices)
        self.out_channels = tuple((embed_dim // 4, embed_dim // 2, embed_dim, embed_dim)[i] for i in self.out_indices)

        self.patch_embed = PatchEmbed(in_chans, embed_dim, patch_size, norm=False)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = torch.linspace(0, drop_path_rate, depth, device='cpu').tolist()
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, dpr[j], 1, norm_eps,
                  layer_scale_init, attn_layer, mlp_layer, norm_layer) for j in range(depth))
        self._setup_position(Geometry((embed_dim,), (depth,), (num_heads,), (patch_size,), (1,),
                                      self.num_prefix_tokens), pos_encoding, [depth])
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.num_features = embed_dim
        self.feature_info = [dict(module=f'blocks.{j}', num_chs=embed_dim, reduction=patch_size)
                             for j in range(depth)]
        if features_only:
            self.simple_fpn = nn.ModuleDict({str(i): _simple_pyramid_level(i, embed_dim) for i in self.out_indices})
            self.unbuilt_prefixes = ('head.',)
        else:
            self.unbuilt_prefixes = ()
            self.reset_classifier(num_classes)

        frozen: List = []
        if frozen_stages >= 0:
            frozen += [self.patch_embed] + ([self.cls_token] if self.cls_token is not None else [])
            frozen += self._position_parts(0, (), embedding=True)
        frozen += list(self.blocks[:max(frozen_stages, 0)]) + self._position_parts(0, range(max(frozen_stages, 0)))
        self._finish_init(frozen, grad_checkpointing)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=.02)

    def _tokens(self, x: torch.Tensor, tap=None, stop: Optional[int] = None):
        """Tokens (B, prefix + h * w, C) after the blocks up to ``stop`` (default: all; see ``_run_blocks``),
        not yet normed, and the token map size (h, w)."""
        x, hw = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(self._embed_position(0, x, hw))
        return self._run_blocks(self.blocks, 0, x, hw, tap, stop), hw

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Normed tokens (B, prefix + N, C)."""
        self._check_input(x)
        return self.norm(self._tokens(x)[0])

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 0] if self.num_prefix_tokens else x.mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor):
        self._check_input(x)
        if not self.features_only:
            return self.forward_head(self.norm(self._tokens(x)[0]))
        H, W = x.shape[-2:]
        tokens, hw = self._tokens(x)
        feat = tokens_to_map(self.norm(tokens)[:, self.num_prefix_tokens:], hw)
        outs = []
        for i in self.out_indices:
            s = PYRAMID_STRIDES[i]
            outs.append(self.simple_fpn[str(i)](feat)[..., :(H + s - 1) // s, :(W + s - 1) // s].contiguous())
        return tuple(outs)

    def forward_intermediates(self, x: torch.Tensor, indices: Union[None, int, Sequence[int]] = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = 'NCHW',
                              intermediates_only: bool = False):
        """timm's feature API (as for its ViTs): the patch tokens after the blocks ``indices`` picks
        (``base.take_indices``; each after its PEG), as stride-``patch_size`` NCHW maps, normed if ``norm``;
        unless ``intermediates_only`` also the normed tokens after the last block run, for ``forward_head``."""
        self._check_input(x)
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, max_index = take_indices(len(self.blocks), indices)
        maps = []
        prefix = self.num_prefix_tokens

        def tap(j: int, tokens: torch.Tensor) -> None:
            if j in take:
                tokens = (self.norm(tokens) if norm else tokens)[:, prefix:]
                maps.append(tokens_to_map(tokens, hw).contiguous() if output_fmt == 'NCHW' else tokens)

        p = self.patch_embed.patch_size
        hw = tuple((n + p - 1) // p for n in x.shape[-2:])
        stop = max_index if stop_early or intermediates_only else None
        tokens, _ = self._tokens(x, tap, stop)
        return maps if intermediates_only else (self.norm(tokens), maps)

    def _cut_to(self, keep: int) -> List[str]:
        dropped = [f'blocks.{j}.' for j in range(keep, len(self.blocks))]
        self.blocks = self.blocks[:keep]
        return dropped + self._cut_position([keep])
