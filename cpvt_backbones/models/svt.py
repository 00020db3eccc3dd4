"""Twins-SVT: the PCPVT pyramid with blocks that alternate windowed and global sub-sampled attention."""
from collections.abc import Sequence
from typing import Any

from .pcpvt import PyramidCPVT


class TwinsSVT(PyramidCPVT):
    """Twins-SVT (arXiv 2104.13840): a ``PyramidCPVT`` with windows (all said there holds) and SVT's stage
    settings by default. In every stage blocks 0, 2, ... attend within non-overlapping windows of
    ``window_sizes[i]`` tokens per side, blocks 1, 3, ... over the whole map with keys and values reduced
    ``sr_ratios[i]`` times per side; the default PEG follows block 0 of every stage. State-dict keys are those of
    the official ``alt_gvt`` weights and of timm's ``twins_svt_*``."""

    def __init__(
        self,
        embed_dims: Sequence[int] = (64, 128, 256, 512),
        depths: Sequence[int] = (2, 2, 10, 4),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        mlp_ratios: Sequence[float] = (4, 4, 4, 4),
        window_sizes: Sequence[int] = (7, 7, 7, 7),
        **kwargs: Any,
    ):
        """
        Args:
            embed_dims: width of each stage's tokens.
            depths: blocks of each stage (windowed and global in turn, windowed first).
            num_heads: attention heads of each stage's blocks.
            mlp_ratios: MLP hidden width over the stage's width.
            window_sizes: each stage's window side in tokens (required: without windows the model is PyramidCPVT).
            **kwargs: ``PyramidCPVT``'s other arguments (``sr_ratios``, ``patch_sizes``, ``window_mask``,
                ``pos_encoding``, ``frozen_stages``) and ``CPVTBase``'s.
        """
        if window_sizes is None:
            raise ValueError('TwinsSVT needs window_sizes (one per stage); without windows the model is PyramidCPVT')
        super().__init__(embed_dims=embed_dims, depths=depths, num_heads=num_heads, mlp_ratios=mlp_ratios,
                         window_sizes=window_sizes, **kwargs)
