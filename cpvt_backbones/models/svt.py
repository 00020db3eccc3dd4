"""Twins-SVT: the PCPVT pyramid with blocks that alternate windowed and global sub-sampled attention."""
import math
from collections.abc import Sequence
from functools import partial
from typing import Any

from ..layers import LocallyGroupedAttention
from .pcpvt import PyramidCPVT


class TwinsSVT(PyramidCPVT):
    """Twins-SVT (arXiv 2104.13840): a ``PyramidCPVT`` (all said there holds: classifier and dense backbone at
    any H, W >= 1, ``pos_encoding``, freezing, the feature API) whose blocks alternate two attentions in every
    stage. Blocks 0, 2, ... attend within non-overlapping windows of ``window_sizes[i]`` tokens per side
    (``layers.LocallyGroupedAttention``: keys ``attn.qkv``, ``attn.proj``); blocks 1, 3, ... attend over the whole
    map with keys and values from the map reduced ``sr_ratios[i]`` times per side (``attn_layer``, by default
    ``layers.Attention``: ``attn.q``, ``attn.kv``, ``attn.sr``, ``attn.norm``, ``attn.proj``). The default PEG
    follows block 0 of every stage. State-dict keys are those of the official ``alt_gvt`` weights and of timm's
    ``twins_svt_*``.

    ``min_trace_side``: the smallest input side at which every stage's map spans two windows or more; exports
    (``deploy``) trace at least that large, since a graph traced where a map is one window is recorded for one
    window only (torch.export specialises the partition's reshape to it and the converted graph is wrong at
    other sizes).

    Every position encoding applies except ``rpe``, whose bias is sized for global attention (refused here);
    RoPE turns the windowed blocks' keys by their own tokens' angles.
    """

    def __init__(
        self,
        embed_dims: Sequence[int] = (64, 128, 256, 512),
        depths: Sequence[int] = (2, 2, 10, 4),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        mlp_ratios: Sequence[float] = (4, 4, 4, 4),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        patch_sizes: Sequence[int] = (4, 2, 2, 2),
        window_sizes: Sequence[int] = (7, 7, 7, 7),
        window_mask: bool = False,
        **kwargs: Any,
    ):
        """
        Args:
            embed_dims: width of each stage's tokens.
            depths: blocks of each stage (windowed and global in turn, windowed first).
            num_heads: attention heads of each stage's blocks.
            mlp_ratios: MLP hidden width over the stage's width.
            sr_ratios: how many times each stage's global blocks reduce the key/value map per side.
            patch_sizes: each stage's patch size, its stride over the previous stage's map (the image for the
                first), so stage strides 4, 8, 16, 32 by default.
            window_sizes: each stage's window side in tokens; maps are zero-padded bottom/right to whole windows.
            window_mask: False lets the padded tokens take part in windowed attention as keys (timm's
                behaviour, the classifiers' default); True masks them out (the Twins release's dense code).
            **kwargs: ``CPVTBase``'s arguments.
        """
        window_sizes = tuple(window_sizes)
        if len(window_sizes) != len(depths):
            raise ValueError(f'window_sizes needs one entry per stage ({len(depths)}), got {window_sizes!r}')
        self.window_sizes, self.window_mask = window_sizes, window_mask  # read by _build_trunk (super().__init__)
        super().__init__(embed_dims=embed_dims, depths=depths, num_heads=num_heads, mlp_ratios=mlp_ratios,
                         sr_ratios=sr_ratios, patch_sizes=patch_sizes, **kwargs)
        strides = [math.prod(tuple(patch_sizes)[:i + 1]) for i in range(len(depths))]
        self.min_trace_side = max(2 * ws * stride for ws, stride in zip(window_sizes, strides, strict=True))
        biased = [enc.name for enc in self.pos_encodings
                  if any(p is not None and p.bias is not None for p in enc.attention(0, (1, 1)) or ())]
        if biased:
            raise ValueError(f'position encoding {biased[0]!r} biases global attention logits; the windowed blocks '
                             'of TwinsSVT cannot take it')

    def _build_trunk(self, stages, blocks, *, norm_layer, drop_rate) -> None:
        windowed = [partial(LocallyGroupedAttention, window_size=ws, window_mask=self.window_mask)
                    for ws in self.window_sizes]
        alternating = [[partial(make, attn_layer=windowed[i], sr_ratio=1) if j % 2 == 0 else make
                        for j, make in enumerate(makers)] for i, makers in enumerate(blocks)]
        super()._build_trunk(stages, alternating, norm_layer=norm_layer, drop_rate=drop_rate)
