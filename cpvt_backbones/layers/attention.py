"""Multi-head attention with optional spatial reduction of keys and values (PVT's SRA, Twins' GSA)."""
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .layout import map_to_tokens, pad_to_multiple, tokens_to_map
from .position.base import AttentionPosition, rotate


class Attention(nn.Module):
    """Multi-head self-attention whose keys and values come from a map reduced ``sr_ratio`` times per side.

    With ``sr_ratio > 1`` the token map is convolved with a kernel = stride = ``sr_ratio`` convolution and
    layer-normed before the key/value projection, so attention costs O(N * N / sr^2) instead of O(N^2).
    A map whose side is not a multiple of ``sr_ratio`` is zero-padded bottom/right first, so every row and
    column of the input is represented among the keys and any map size (even 1 x 1) works.

    A position encoding that acts inside attention passes an ``AttentionPosition``: a module that makes the
    query/key input (values keep the tokens), rotary angles for queries and keys, or a bias on the logits.

    The projections keep the official key names (``q``, ``kv``, ``sr``, ``norm``, ``proj``) and attention runs
    through ``F.scaled_dot_product_attention``. The reduction's norm is ``norm_layer(dim)`` at its default eps
    (1e-5 for ``nn.LayerNorm``, as the official Twins code and timm; only the blocks' norms use 1e-6).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0., sr_ratio: int = 1, norm_layer: Callable[..., nn.Module] = nn.LayerNorm):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} must be divisible by num_heads {num_heads}')
        if sr_ratio < 1:
            raise ValueError(f'sr_ratio must be >= 1, got {sr_ratio}')
        self.num_heads = num_heads
        self.sr_ratio = sr_ratio
        self.attn_drop = attn_drop
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = norm_layer(dim)

    def _keys_values(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, heads, M, head_dim) from the (reduced) token map."""
        B, _, C = x.shape
        if self.sr_ratio > 1:
            x = self.norm(map_to_tokens(self.sr(pad_to_multiple(tokens_to_map(x, hw), self.sr_ratio))))
        k, v = self.kv(x).reshape(B, x.shape[1], 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        return k, v

    def attend(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None
               ) -> torch.Tensor:
        """Attention output before the output projection, (B, N, C)."""
        B, N, C = x.shape
        separate_qk = pos is not None and pos.qk_input is not None
        qk_input = pos.qk_input(x, hw) if separate_qk else x
        q = self.q(qk_input).reshape(B, N, self.num_heads, C // self.num_heads).transpose(1, 2)
        k, v = self._keys_values(x, hw)
        if separate_qk:
            k = self._keys_values(qk_input, hw)[0]
        bias = None
        if pos is not None:
            if pos.rotary is not None:
                q, k = rotate(q, pos.rotary.query), rotate(k, pos.rotary.key)
            if pos.bias is not None:
                bias = pos.bias.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                             dropout_p=self.attn_drop if self.training else 0.)
        return out.transpose(1, 2).reshape(B, N, C)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None
                ) -> torch.Tensor:
        return self.proj_drop(self.proj(self.attend(x, hw, pos)))
