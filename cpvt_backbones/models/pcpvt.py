"""The pyramid trunk every pyramid family builds from its stage spec, and Pyramid CPVT (Twins-PCPVT): PVT's four
stages with spatial-reduction attention, a PEG, and GAP."""
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..layers import PatchEmbed, tokens_to_map
from ..layers.valid import region
from .base import CPVTBase, Parts, Stage, per_stage, stage_strides, take_indices


class Pyramid(CPVTBase):
    """A pyramid vision transformer built from its stage spec (``base.Stage``): the loop every pyramid family
    shares (``PyramidCPVT``, ``TwinsSVT``, ``PVTv2``); a family's constructor only writes its stages.

    * ``features_only=False``: classifier. A final norm on the last stage (unless the stage has its own), global
      average pooling, linear ``head`` (``num_classes=0`` returns the pooled features).
    * ``features_only=True``: dense backbone. Returns a tuple of NCHW maps for ``out_indices`` of
      ceil(H / s) x ceil(W / s) at the stages' strides s (4, 8, 16, 32 for the published families), for any
      H, W >= 1. It builds no head, no final norm and no stage beyond ``max(out_indices)``: every parameter it
      owns receives a gradient.

    Inputs in either memory format, contiguous or not, give the same result.
    """

    def __init__(self, stages: Sequence[Stage], *, pos_encoding: Any = 'peg', frozen_stages: int = -1,
                 **kwargs: Any):
        """Build the trunk ``stages`` (``base.Stage``; the family's constructor writes them, a user does not).

        Args:
            pos_encoding: the position encodings (``cpvt_backbones.layers.position``): by default ``'peg'``, a
                PEG after the first block of every stage, numbered in network order as ``pos_block.{k}``; or e.g.
                ``dict(type='peg', positions=((0, 1), (0,), (0,), (0,)), kernel_size=5)``, ``'rope_mixed'``,
                ``'learned+peg'``, ``'none'``, or a list of those. ``rpe`` takes only global attention over keys
                reduced with padding (a ValueError otherwise); RoPE turns the windowed blocks' keys by their own
                tokens' angles and refuses pooled keys.
            frozen_stages: -1 freezes nothing; 0 the first patch embedding (and a position table); k >= 1 also
                stages 0..k-1 entirely, with their position-encoding parts. Frozen parts have
                ``requires_grad=False`` and stay in eval mode while the model trains.
            **kwargs: ``CPVTBase``'s arguments.
        """
        super().__init__(stages, num_levels=len(stages), pos_encoding=pos_encoding, frozen_stages=frozen_stages,
                         **kwargs)

    @property
    def min_trace_side(self) -> int:
        """The smallest input side at which every stage's map spans two windows or more and every
        ``reduction='drop'`` keeps one cell or more (0 where neither applies); exports trace at least that large
        (``deploy.check.trace_size``)."""
        # Traced at one window, torch.export specialises the window partition's reshape to it: the recorded graph
        # is wrong at other sizes.
        strides = stage_strides(self.stage_specs)
        return max([2 * s.window_size * stride for s, stride in zip(self.stage_specs, strides)
                    if s.window_size is not None] +
                   [s.sr_ratio * stride for s, stride in zip(self.stage_specs, strides) if s.reduction == 'drop'],
                   default=0)

    def _build_trunk(self, parts: Parts) -> tuple[list[int], list[str]]:
        """``patch_embeds``, ``pos_drops``, ``blocks`` and ``norms`` (identities where a stage has none) of the
        stages up to the last output (all for a classifier), from their specs."""
        stages = self.stage_specs
        built = stages[:self.out_indices[-1] + 1] if self.features_only else stages
        drop_paths = parts.drop_paths(stages)
        self.patch_embeds, self.pos_drops, self.blocks, self.norms = (nn.ModuleList() for _ in range(4))
        prev = self.in_chans
        for i, stage in enumerate(built):
            self.patch_embeds.append(PatchEmbed(prev, stage.dim, stage.patch_size, norm_layer=parts.norm_layer,
                                                kernel_size=stage.embed_kernel))
            self.pos_drops.append(nn.Dropout(parts.drop_rate))
            self.blocks.append(nn.ModuleList(parts.block(stage, j, rate) for j, rate in enumerate(drop_paths[i])))
            self.norms.append(parts.norm(stage.dim) if stage.norm else nn.Identity())
            prev = stage.dim
        dropped = [f'{name}.{i}.' for i in range(len(built), len(stages)) for name in ('patch_embeds', 'blocks',
                                                                                       'norms')]
        return [s.depth for s in built], dropped

    def _build_outputs(self, parts: Parts) -> list[str]:
        """The final norm on the last stage (unless the stage has its own; none for a dense backbone)."""
        built = self.stage_specs[:len(self.blocks)]
        strides = stage_strides(self.stage_specs)
        self.out_channels = tuple(self.stage_specs[i].dim for i in self.out_indices)
        self.strides = tuple(strides[i] for i in self.out_indices)
        self.num_features = built[-1].dim
        self.feature_info = [dict(module=f'blocks.{i}', num_chs=stage.dim, reduction=strides[i])
                             for i, stage in enumerate(built)]
        if self.features_only:
            return ['norm.']
        self.norm = nn.Identity() if built[-1].norm else parts.norm(built[-1].dim)
        return []

    def _frozen_parts(self, frozen_stages: int) -> list:
        """The first patch embedding (and a position table) from 0 on, and stages 0..frozen_stages-1 entirely,
        with their position-encoding parts."""
        self.check_frozen_stages(frozen_stages, len(self.blocks), 'built stages')
        parts: list = []
        if frozen_stages >= 0:
            parts += [self.patch_embeds[0]] + self._position_parts(0, (), embedding=True)
        for i in range(max(frozen_stages, 0)):
            parts += [self.patch_embeds[i], self.blocks[i], self.norms[i]] + \
                self._position_parts(i, range(len(self.blocks[i])), True)
        return parts

    @property
    def embed_dims(self) -> tuple[int, ...]:
        return tuple(s.dim for s in self.stage_specs)

    def _stages(self, x: torch.Tensor, take: Sequence[int] = (), stop: int | None = None,
                norm_last: bool = False, sizes: torch.Tensor | None = None):
        """Run the built stages up to ``stop`` (default: all); return the last run stage's tokens, its (H, W)
        and the NCHW maps of the stages in ``take`` (the last built one normed if ``norm_last``). ``sizes``: each
        image's valid (h, w) in pixels of a padded batch (``layers.valid``): every stage keeps the tokens beyond
        each image zero, the returned ones included."""
        maps = []
        last = len(self.blocks) - 1
        stride = 1
        inputs = region(sizes, 1, x.shape[-2:]).fill_map(x)
        for i, embed in enumerate(self.patch_embeds):
            if stop is not None and i > stop:
                break
            x, hw = embed(inputs)
            stride *= embed.patch_size
            area = region(sizes, stride, hw)
            x = self.pos_drops[i](self._embed_position(i, x, hw, area))
            x = area.zero_tokens(self.norms[i](self._run_blocks(self.blocks[i], i, x, hw, area)))
            if i in take:
                out = area.zero_tokens(self.norm(x)) if norm_last and i == last else x
                maps.append(tokens_to_map(out, hw).contiguous())
            inputs = tokens_to_map(x, hw)   # zeroed as tokens, as the PEG does
        return x, hw, maps

    def _final_stride(self) -> int:
        return stage_strides(self.stage_specs)[len(self.blocks) - 1]

    def forward_features(self, x: torch.Tensor, valid_sizes=None) -> torch.Tensor:
        """Normed tokens (B, N, C) of the last stage; a RuntimeError on a ``features_only`` model. ``valid_sizes``:
        see ``forward``; the tokens beyond each image are zero."""
        if self.features_only:
            raise RuntimeError('a features_only model has no final norm; call forward() for its feature maps')
        return self._features(x, self._check_input(x, valid_sizes))

    def _features(self, x: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
        x, hw, _ = self._stages(x, sizes=sizes)
        return region(sizes, self._final_stride(), hw).zero_tokens(self.norm(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, valid_sizes=None) -> torch.Tensor:
        """Global average pooling and the head on ``forward_features``' tokens; with its ``valid_sizes``, each
        image's own tokens averaged."""
        x = self._pooled(x, valid_sizes, self._final_stride())
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, valid_sizes=None):
        """Feature maps (``features_only``) or logits of ``x`` (B, C, H, W). ``valid_sizes``: for a batch padded
        bottom/right to a common size, each image's (h, w) in pixels ((B, 2) ints, a tensor or pairs): each image
        then gets on its valid region what it gets alone, and zeros beyond (``layers.valid``)."""
        sizes = self._check_input(x, valid_sizes)
        if self.features_only:
            return tuple(self._stages(x, take=self.out_indices, sizes=sizes)[2])
        return self.forward_head(self._features(x, sizes), valid_sizes=sizes)

    def forward_intermediates(self, x: torch.Tensor, indices: None | int | Sequence[int] = None,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = 'NCHW', intermediates_only: bool = False, output_dict: bool = False,
                              valid_sizes=None):
        """timm's feature API, with the keywords of its ViTs: the NCHW maps after the stages ``indices`` picks
        (``base.take_indices``), and unless ``intermediates_only`` the normed last-stage tokens for
        ``forward_head``: ``(final, intermediates)``. ``norm`` applies the final norm to the last stage's map (a
        ValueError on a ``features_only`` model); ``return_prefix_tokens`` changes nothing (there are none).
        ``output_dict`` returns ``{'image_intermediates': ..., 'image_features': final}`` (without the final
        tokens when ``intermediates_only``). ``output_fmt`` other than 'NCHW': a ValueError. ``valid_sizes``: see
        ``forward``."""
        sizes = self._check_input(x, valid_sizes)
        if output_fmt != 'NCHW':
            raise ValueError(f"PyramidCPVT returns NCHW maps; output_fmt={output_fmt!r} is not supported")
        if norm and self.features_only:
            raise ValueError('a features_only model has no final norm: pass norm=False')
        take, max_index = take_indices(len(self.blocks), indices)
        stop = max_index if stop_early or intermediates_only else None
        x, hw, maps = self._stages(x, take, stop, norm_last=norm, sizes=sizes)
        final = None if intermediates_only else x if self.features_only or stop is not None else \
            region(sizes, self._final_stride(), hw).zero_tokens(self.norm(x))
        if output_dict:
            return dict(image_intermediates=maps, **({} if final is None else dict(image_features=final)))
        return maps if intermediates_only else (final, maps)

    def _cut_to(self, keep: int) -> list[str]:
        dropped = [f'{name}.{i}.' for i in range(keep, len(self.blocks))
                   for name in ('patch_embeds', 'blocks', 'norms')]
        kept_depths = [len(b) for b in self.blocks[:keep]]
        for name in ('patch_embeds', 'pos_drops', 'blocks', 'norms'):
            setattr(self, name, getattr(self, name)[:keep])
        return dropped + self._cut_position(kept_depths)


def twins_stages(embed_dims: Sequence[int], depths: Sequence[int], num_heads: Sequence[int],
                 mlp_ratios: Sequence[float], sr_ratios: Sequence[int], patch_sizes: Sequence[int],
                 window_sizes: Sequence[int] | None = None, window_mask: bool = False) -> tuple[Stage, ...]:
    """The stages of a Twins pyramid (``PyramidCPVT``; with ``window_sizes``, ``TwinsSVT``), one value per stage
    in each sequence."""
    windows = {} if window_sizes is None else dict(window_sizes=window_sizes)
    rows = per_stage(embed_dims=embed_dims, depths=depths, num_heads=num_heads, mlp_ratios=mlp_ratios,
                     sr_ratios=sr_ratios, patch_sizes=patch_sizes, **windows)
    return tuple(Stage(dim=d, depth=n, num_heads=h, mlp_ratio=r, patch_size=p, sr_ratio=sr,
                       window_size=ws[0] if ws else None, window_mask=window_mask)
                 for d, n, h, r, sr, p, *ws in rows)


class PyramidCPVT(Pyramid):
    """Four-stage pyramid vision transformer with conditional positional encodings (Twins-PCPVT): a ``Pyramid`` (all
    said there holds) of non-overlapping patch embeddings, keys and values reduced with padding, plain MLPs, a PEG
    and a final LayerNorm; every block attends globally (the windowed form is ``TwinsSVT``). State-dict keys and
    shapes are those of the official Twins weights and of timm's ``twins_pcpvt_*``."""

    def __init__(
        self,
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        depths: Sequence[int] = (3, 4, 6, 3),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8, 8, 4, 4),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        patch_sizes: Sequence[int] = (4, 2, 2, 2),
        **kwargs: Any,
    ):
        """
        Args:
            embed_dims: width of each stage's tokens.
            depths: blocks of each stage.
            num_heads: attention heads of each stage's blocks.
            mlp_ratios: MLP hidden width over the stage's width.
            sr_ratios: how many times each stage's global attention reduces the key/value map per side (PVT's
                SRA).
            patch_sizes: each stage's patch size, its stride over the previous stage's map (the image for the
                first), so stage strides 4, 8, 16, 32 by default.
            **kwargs: ``Pyramid``'s ``pos_encoding`` and ``frozen_stages``, and ``CPVTBase``'s arguments.
        """
        super().__init__(twins_stages(embed_dims, depths, num_heads, mlp_ratios, sr_ratios, patch_sizes), **kwargs)
