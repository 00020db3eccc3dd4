"""Columnar (DeiT-style) CPVT: a plain ViT whose position encoding is a part of its own, by default PEGs."""
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import LayerNorm2d, PatchEmbed, tokens_to_map
from ..layers.valid import region
from .base import CPVTBase, Parts, Stage, take_indices

PYRAMID_STRIDES = (4, 8, 16, 32)


class CeilMaxPool(nn.Module):
    """2 x 2 max pooling to ceil(H / 2) x ceil(W / 2): the result of ``nn.MaxPool2d(2, 2, ceil_mode=True)``, in a
    form every engine takes down to a 1 x 1 map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A -inf row and column, then no ceil mode: OpenVINO's pooling refuses a window larger than its input, and
        # its converter has no rule for an exported model's symbolic ``%``.
        return F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float('-inf')), 2, 2)


def _simple_pyramid_level(level: int, dim: int, act_layer: Callable[..., nn.Module]) -> nn.Module:
    """ViTDet's simple feature pyramid: from the stride-16 map, two 2x deconvolutions give stride 4 (with
    ViTDet's channels-first LayerNorm and the model's activation between them), one gives stride 8, identity
    stride 16, 2x max-pooling stride 32 (ceil mode, so ceil(H / 32) rows)."""
    if level == 0:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, 2), LayerNorm2d(dim // 2, eps=1e-6), act_layer(),
                             nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2))
    if level == 1:
        return nn.ConvTranspose2d(dim, dim // 2, 2, 2)
    if level == 2:
        return nn.Identity()
    return CeilMaxPool()


class CPVT(CPVTBase):
    """DeiT-style vision transformer with conditional positional encodings (CPVT, arXiv 2102.10882).

    By default ``pos_block.{k}`` is the k-th PEG, after blocks 0-5 (``pos_block.peg_after[(0, j)] = k``), and
    there is no position table. ``pos_encoding`` chooses any other (``cpvt_backbones.layers.position``):
    ``dict(type='peg', positions=(0,))``, ``'learned'`` (a table for a 224 px input, resized to any other),
    ``'sincos'``, ``'rpe'``, ``'rope_axial'``, ``'rope_mixed'``, ``'none'``, ``'conv1x1'``, ``'peg_qk'``,
    ``dict(type='peg', frozen=True)``, or combinations (``'learned+peg'``). ``class_token=False`` is the GAP
    variant (average of the normed patch tokens). The patch embedding is DeiT's (a convolution, no norm).

    ``features_only=True`` turns it into a dense backbone: the normed stride-16 patch tokens are laid out as
    a map and a ViTDet-style simple feature pyramid makes maps at strides 4, 8, 16, 32 with dim/4, dim/2,
    dim, dim channels and spatial size ceil(H / s) x ceil(W / s) (upsampled maps cropped to it). Only the
    levels in ``out_indices`` are built. Every other argument is ``CPVTBase``'s.
    """

    def __init__(
        self,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.,
        patch_size: int = 16,
        class_token: bool = True,
        pos_encoding: Any = MappingProxyType(dict(type='peg', positions=(0, 1, 2, 3, 4, 5))),
        frozen_stages: int = -1,
        **kwargs: Any,
    ):
        """
        Args:
            embed_dim: width of the tokens.
            depth: number of blocks.
            num_heads: attention heads of every block.
            mlp_ratio: MLP hidden width over ``embed_dim``.
            patch_size: side of the square patches, the stride of the token grid (16 for ``features_only``: a
                ValueError otherwise).
            class_token: prepend a class token and classify from it; False averages the patch tokens (GAP).
            pos_encoding: the position encodings (``cpvt_backbones.layers.position``): by default PEGs after
                blocks 0-5 (``pos_block.{k}`` is the k-th); a name, a dict with ``type`` and the encoding's
                options, or a list of those (see the class).
            frozen_stages: counts blocks: -1 freezes nothing; 0 the patch embedding, class token and position
                table; k >= 1 also blocks 0..k-1 and their position-encoding parts (the PEGs after them, their
                RoPE frequencies or relative biases). Frozen parts have ``requires_grad=False`` and stay in eval
                mode while the model trains.
            **kwargs: ``CPVTBase``'s arguments.
        """
        if kwargs.get('features_only') and patch_size != 16:
            raise ValueError(f'the simple feature pyramid is built on stride-16 tokens, got patch_size {patch_size}')
        super().__init__((Stage(embed_dim, depth, num_heads, mlp_ratio, patch_size),), num_levels=len(PYRAMID_STRIDES),
                         num_prefix_tokens=int(class_token), pos_encoding=pos_encoding, frozen_stages=frozen_stages,
                         **kwargs)

    def _build_trunk(self, parts: Parts) -> tuple[list[int], list[str]]:
        stage, = self.stage_specs
        self.patch_embed = PatchEmbed(self.in_chans, stage.dim, stage.patch_size, norm_layer=None)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, stage.dim)) if self.num_prefix_tokens else None
        self.pos_drop = nn.Dropout(parts.drop_rate)
        drop_paths, = parts.drop_paths(self.stage_specs)
        self.blocks = nn.ModuleList(parts.block(stage, j, rate) for j, rate in enumerate(drop_paths))
        return [stage.depth], []

    def _build_outputs(self, parts: Parts) -> list[str]:
        dim, patch_size = self.embed_dim, self.patch_embed.patch_size
        self.strides = tuple(PYRAMID_STRIDES[i] for i in self.out_indices)
        self.out_channels = tuple((dim // 4, dim // 2, dim, dim)[i] for i in self.out_indices)
        self.norm = parts.norm(dim)
        self.num_features = dim
        self.feature_info = [dict(module=f'blocks.{j}', num_chs=dim, reduction=patch_size)
                             for j in range(len(self.blocks))]
        if self.features_only:
            self.simple_fpn = nn.ModuleDict({str(i): _simple_pyramid_level(i, dim, parts.act_layer)
                                             for i in self.out_indices})
        return []

    def _init_weights(self) -> None:
        super()._init_weights()
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=.02)

    def _frozen_parts(self, frozen_stages: int) -> list:
        self.check_frozen_stages(frozen_stages, len(self.blocks), 'blocks')
        frozen: list = []
        if frozen_stages >= 0:
            frozen += [self.patch_embed] + ([self.cls_token] if self.cls_token is not None else [])
            frozen += self._position_parts(0, (), embedding=True)
        blocks = range(max(frozen_stages, 0))
        return frozen + [self.blocks[j] for j in blocks] + self._position_parts(0, blocks)

    @property
    def embed_dim(self) -> int:
        return self.stage_specs[0].dim

    def _tokens(self, x: torch.Tensor, tap=None, stop: int | None = None, sizes: torch.Tensor | None = None):
        """Tokens (B, prefix + h * w, C) after the blocks up to ``stop`` (default: all; see ``_run_blocks``),
        not yet normed (beyond each image as the last layer left them), the token map size (h, w) and the tokens'
        region (``layers.valid``; ``sizes``: each image's valid (h, w) in pixels of a padded batch, or None)."""
        x, hw = self.patch_embed(region(sizes, 1, x.shape[-2:]).fill_map(x))
        area = region(sizes, self.patch_embed.patch_size, hw, self.num_prefix_tokens)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(self._embed_position(0, x, hw, area))
        return self._run_blocks(self.blocks, 0, x, hw, area, tap, stop), hw, area

    def forward_features(self, x: torch.Tensor, valid_sizes=None) -> torch.Tensor:
        """Normed tokens (B, prefix + N, C); ``valid_sizes``: see ``forward`` (tokens beyond each image zero)."""
        return self._features(x, self._check_input(x, valid_sizes))

    def _features(self, x: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
        x, _, area = self._tokens(x, sizes=sizes)
        return area.zero_tokens(self.norm(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, valid_sizes=None) -> torch.Tensor:
        """The class token, or the average of the patch tokens (each image's own with ``forward_features``'
        ``valid_sizes``), then the head."""
        x = x[:, 0] if self.num_prefix_tokens else self._pooled(x, valid_sizes, self.patch_embed.patch_size)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, valid_sizes=None):
        """Logits, or with ``features_only`` the feature maps, of ``x`` (B, C, H, W). ``valid_sizes``: for a
        batch padded bottom/right to a common size, each image's (h, w) in pixels ((B, 2) ints, a tensor or
        pairs): each image then gets on its valid region what it gets alone, and zeros beyond
        (``layers.valid``)."""
        sizes = self._check_input(x, valid_sizes)
        if not self.features_only:
            return self.forward_head(self._features(x, sizes), valid_sizes=sizes)
        H, W = x.shape[-2:]
        tokens, hw, area = self._tokens(x, sizes=sizes)
        feat = tokens_to_map(area.zero_tokens(self.norm(tokens))[:, self.num_prefix_tokens:], hw)
        outs = []
        for i in self.out_indices:
            s = PYRAMID_STRIDES[i]
            # max pooling: alone the map ends at each image's border
            level = area.fill_map(feat, float('-inf')) if i == 3 else feat
            out = self.simple_fpn[str(i)](level)[..., :(H + s - 1) // s, :(W + s - 1) // s]
            outs.append(region(sizes, s, out.shape[-2:]).fill_map(out).contiguous())
        return tuple(outs)

    def forward_intermediates(self, x: torch.Tensor, indices: None | int | Sequence[int] = None,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW', intermediates_only: bool = False, output_dict: bool = False,
                              valid_sizes=None):
        """timm's feature API, as its ViTs' ``forward_intermediates``: the patch tokens after the blocks
        ``indices`` picks (``base.take_indices``; each after its PEG), as stride-``patch_size`` NCHW maps
        (``output_fmt='NLC'``: (B, h * w, C) tokens), normed if ``norm``; unless ``intermediates_only`` also the
        normed tokens after the last block run, for ``forward_head``: ``(final, intermediates)``.
        ``return_prefix_tokens`` makes each intermediate a pair ``(map, prefix)`` with the (B, 1, C) class token,
        for a model that has one (a GAP model returns plain maps). ``output_dict`` returns
        ``{'image_intermediates': ..., 'image_features': final}`` (without the final tokens when
        ``intermediates_only``), with ``'image_intermediates_prefix'`` when prefix tokens are asked for and exist.
        ``output_fmt`` other than 'NCHW' or 'NLC': a ValueError. ``valid_sizes``: see ``forward`` (tokens beyond
        each image zero)."""
        sizes = self._check_input(x, valid_sizes)
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, max_index = take_indices(len(self.blocks), indices)
        maps, prefixes = [], []
        prefix = self.num_prefix_tokens

        def tap(j: int, tokens: torch.Tensor) -> None:
            if j in take:
                tokens = area.zero_tokens(self.norm(tokens) if norm else tokens)
                prefixes.append(tokens[:, :prefix])
                tokens = tokens[:, prefix:]
                maps.append(tokens_to_map(tokens, hw).contiguous() if output_fmt == 'NCHW' else tokens)

        p = self.patch_embed.patch_size
        hw = tuple((n + p - 1) // p for n in x.shape[-2:])
        area = region(sizes, p, hw, prefix)
        stop = max_index if stop_early or intermediates_only else None
        tokens, _, _ = self._tokens(x, tap, stop, sizes)
        final = None if intermediates_only else area.zero_tokens(self.norm(tokens))
        with_prefix = return_prefix_tokens and prefix > 0
        if output_dict:
            out = dict(image_intermediates=maps)
            if with_prefix:
                out['image_intermediates_prefix'] = prefixes
            if not intermediates_only:
                out['image_features'] = final
            return out
        if with_prefix:
            maps = list(zip(maps, prefixes))
        return maps if intermediates_only else (final, maps)

    def _cut_to(self, keep: int) -> list[str]:
        dropped = [f'blocks.{j}.' for j in range(keep, len(self.blocks))]
        self.blocks = self.blocks[:keep]
        return dropped + self._cut_position([keep])
