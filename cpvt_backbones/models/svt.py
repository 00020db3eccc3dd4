"""Twins-SVT: the Twins pyramid with blocks that alternate windowed and global sub-sampled attention."""
from collections.abc import Sequence
from typing import Any

from .pcpvt import Pyramid, twins_stages


class TwinsSVT(Pyramid):
    """Twins-SVT (arXiv 2104.13840): a ``Pyramid`` (all said there holds) built as ``PyramidCPVT`` is, with SVT's
    stage settings by default and windows: in every stage blocks 0, 2, ... attend within non-overlapping windows of
    ``window_sizes[i]`` tokens per side (``layers.LocallyGroupedAttention``: keys ``attn.qkv``, ``attn.proj``; maps
    zero-padded bottom/right to whole windows), blocks 1, 3, ... over the whole map with keys and values reduced
    ``sr_ratios[i]`` times per side; the default PEG follows block 0 of every stage. State-dict keys are those of
    the official ``alt_gvt`` weights and of timm's ``twins_svt_*``."""

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
            patch_sizes: each stage's patch size, its stride over the previous stage's map.
            window_sizes: each stage's window side in tokens (required: without windows the model is PyramidCPVT).
            window_mask: False lets the padded tokens take part in windowed attention as keys; True masks them
                out.
            **kwargs: ``Pyramid``'s ``pos_encoding`` and ``frozen_stages``, and ``CPVTBase``'s arguments.
        """
        if window_sizes is None:
            raise ValueError('TwinsSVT needs window_sizes (one per stage); without windows the model is PyramidCPVT')
        super().__init__(twins_stages(embed_dims, depths, num_heads, mlp_ratios, sr_ratios, patch_sizes,
                                      window_sizes, window_mask), **kwargs)
