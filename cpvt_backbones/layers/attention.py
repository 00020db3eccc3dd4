"""Multi-head attention: global with optional spatial reduction of keys and values (PVT's SRA, Twins' GSA), and
within windows of the token map (Twins' LSA)."""
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .layout import map_to_tokens, pad_to_multiple, symbolic_shapes, tokens_to_map
from .position.base import AttentionPosition, rotate
from .valid import ValidRegion


class Attention(nn.Module):
    """Multi-head self-attention whose keys and values come from a map reduced ``sr_ratio`` times per side.

    With ``sr_ratio > 1`` the token map is convolved with a kernel = stride = ``sr_ratio`` convolution and
    layer-normed before the key/value projection, so attention costs O(N * N / sr^2) instead of O(N^2).
    A map whose side is not a multiple of ``sr_ratio`` is zero-padded bottom/right first, so every row and
    column of the input is represented among the keys and any map size (even 1 x 1) works.

    A position encoding that acts inside attention passes an ``AttentionPosition``: a module that makes the
    query/key input (values keep the tokens), rotary angles for queries and keys, or a bias on the logits.

    With a ``valid`` region (a padded batch, ``layers.valid``) the tokens beyond each image are zeroed before the
    reduction and excluded as keys (a reduced key is kept where it covers the image, as the image alone has it),
    so each image's valid queries attend as they would alone.

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

    def attend(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
               valid: ValidRegion | None = None) -> torch.Tensor:
        """Attention output before the output projection, (B, N, C)."""
        B, N, C = x.shape
        separate_qk = pos is not None and pos.qk_input is not None
        if valid is not None:
            x = valid.zero_tokens(x)
        qk_input = pos.qk_input(x, hw) if separate_qk else x
        if separate_qk and valid is not None:
            qk_input = valid.zero_tokens(qk_input)
        q = self.q(qk_input).reshape(B, N, self.num_heads, C // self.num_heads).transpose(1, 2)
        k, v = self._keys_values(x, hw)
        if separate_qk:
            k = self._keys_values(qk_input, hw)[0]
        mask = None
        if pos is not None:
            if pos.rotary is not None:
                q, k = rotate(q, pos.rotary.query), rotate(k, pos.rotary.key)
            if pos.bias is not None:
                mask = pos.bias.to(q.dtype)
        if valid is not None:
            keys = valid.reduced(self.sr_ratio).key_mask() if self.sr_ratio > 1 else valid.key_mask()
            mask = keys if mask is None else mask.masked_fill(~keys, float('-inf'))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=self.attn_drop if self.training else 0.)
        return out.transpose(1, 2).reshape(B, N, C)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
                valid: ValidRegion | None = None) -> torch.Tensor:
        return self.proj_drop(self.proj(self.attend(x, hw, pos, valid)))


class LocallyGroupedAttention(nn.Module):
    """Multi-head self-attention within non-overlapping ``window_size`` x ``window_size`` windows of the token
    map (Twins' locally-grouped self-attention, LSA).

    The map is zero-padded bottom/right to whole windows, so any H x W works; the outputs of padded tokens are
    dropped. ``window_mask=False``: padded tokens take part as keys and values (their input is zero, so they are
    the projection's biases), as timm's ``twins_svt_*``. ``window_mask=True``: they are masked out as keys, so a
    token attends only to the real tokens of its window, as the Twins release's dense code and mmseg's and
    mmpretrain's SVT mean to (theirs masks only where both H and W are padded: with one side unpadded, a
    ``[-0:]`` slice marks every token as padding, which masks nothing).

    With a ``valid`` region (a padded batch, ``layers.valid``) the tokens beyond each image are zeroed before the
    partition, so the windows of an image hold what they hold alone: its tokens and zeros (its own padding, and
    with ``window_mask`` those are masked out as keys); the batch's further padding lies in windows of its own.

    Takes ``layers.Block``'s ``attn_layer`` arguments: windows reduce nothing, so ``sr_ratio`` must be 1 and
    ``norm_layer`` builds nothing. Of a position encoding's ``AttentionPosition`` it takes the query/key input and
    rotary angles (keys are the query tokens, so both turn by the queries' angles; padded tokens by 0); a bias on
    global attention logits has no place in windows and raises. Keys ``qkv`` (queries, keys, values stacked)
    and ``proj``, as the official weights.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0., sr_ratio: int = 1, norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
                 window_size: int = 7, window_mask: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} must be divisible by num_heads {num_heads}')
        if sr_ratio != 1:
            raise ValueError(f'locally-grouped attention reduces no keys: sr_ratio must be 1, got {sr_ratio}')
        if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size < 1:
            raise ValueError(f'window_size must be an int >= 1, got {window_size!r}')
        if not isinstance(window_mask, bool):
            raise TypeError(f'window_mask must be True or False, got {window_mask!r}')
        self.num_heads = num_heads
        self.window_size = window_size
        self.window_mask = window_mask
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def partition(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """(B, C, H, W) map -> (B, windows, window_size ** 2, C), zero-padded bottom/right to whole windows,
        and the (rows, columns) of windows; windows and the tokens in each are in row-major order."""
        ws = self.window_size
        x = pad_to_multiple(x, ws)
        B, C, Hp, Wp = x.shape
        rows, cols = Hp // ws, Wp // ws
        x = x.reshape(B, C, rows, ws, cols, ws).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(B, rows * cols, ws * ws, C), (rows, cols)

    def merge(self, x: torch.Tensor, grid: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
        """``partition``'s inverse on (B, windows, window_size ** 2, C) windows in a ``grid`` of (rows,
        columns): the (B, H * W, C) tokens of the ``hw`` map, padding dropped."""
        ws = self.window_size
        B, C = x.shape[0], x.shape[-1]
        x = x.reshape(B, grid[0], grid[1], ws, ws, C).transpose(2, 3).reshape(B, grid[0] * ws, grid[1] * ws, C)
        return x[:, :hw[0], :hw[1]].reshape(B, hw[0] * hw[1], C)

    def _split_heads(self, t: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        """(B, windows, T, parts * C) -> ``parts`` tensors (B, windows, heads, T, C / heads)."""
        B, num_windows, T, width = t.shape
        head_dim = width // parts // self.num_heads
        return t.reshape(B, num_windows, T, parts, self.num_heads, head_dim).permute(3, 0, 1, 4, 2, 5).unbind(0)

    def _key_mask(self, x: torch.Tensor, hw: tuple[int, int], valid: ValidRegion | None = None
                  ) -> torch.Tensor | None:
        """(B * windows, 1, 1, window_size ** 2) True for the real tokens of each window, or None where there
        is nothing to mask (no mask asked for, or no padding in an eager call without a ``valid`` region). A
        window of a padded batch that holds no token of its image keeps every key (its outputs are dropped)."""
        ws = self.window_size
        if not self.window_mask:
            return None
        if valid is not None:
            real = self.partition(valid.map_mask().to(x.dtype))[0][..., 0] > 0
            real = real | ~real.any(dim=-1, keepdim=True)
            return real[:, :, None, None, :].flatten(0, 1)
        if not (symbolic_shapes() or hw[0] % ws or hw[1] % ws):
            return None
        real = self.partition(x.new_ones(1, 1, hw[0], hw[1]))[0][..., 0] > 0
        return real[:, :, None, None, :].expand(x.shape[0], -1, -1, -1, -1).flatten(0, 1)

    def _angles(self, angles: torch.Tensor, hw: tuple[int, int], valid: ValidRegion | None) -> torch.Tensor:
        """Rotary angles (heads or 1, H * W, d) as windows broadcasting against (B, windows, heads, T, d)
        queries: zero on padded tokens (those of a batch's padding beyond each image too)."""
        if valid is None:
            return self.partition(tokens_to_map(angles, hw))[0].transpose(0, 1)      # (windows, heads, T, d)
        heads, _, d = angles.shape
        per_image = (angles[None] * valid.token_mask()[:, None, :, None]).flatten(0, 1)  # (B * heads, H * W, d)
        windows = self.partition(tokens_to_map(per_image, hw))[0]                     # (B * heads, windows, T, d)
        return windows.unflatten(0, (-1, heads)).transpose(1, 2)                       # (B, windows, heads, T, d)

    def attend(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
               valid: ValidRegion | None = None) -> torch.Tensor:
        """Attention output before the output projection, (B, N, C)."""
        B, N, C = x.shape
        heads, head_dim = self.num_heads, C // self.num_heads
        if pos is not None and pos.bias is not None:
            raise ValueError('an attention-logit bias (rpe) is sized for global attention and has no place in '
                             'locally-grouped (windowed) attention')
        if valid is not None:
            x = valid.zero_tokens(x)
        windows, grid = self.partition(tokens_to_map(x, hw))
        num_windows, T = windows.shape[1], windows.shape[2]
        q, k, v = self._split_heads(self.qkv(windows), 3)
        if pos is not None and pos.qk_input is not None:
            qk = pos.qk_input(x, hw)
            qk_windows = self.partition(tokens_to_map(qk if valid is None else valid.zero_tokens(qk), hw))[0]
            q, k = self._split_heads(self.qkv(qk_windows)[..., :2 * C], 2)
        if pos is not None and pos.rotary is not None:
            angles = self._angles(pos.rotary.query, hw, valid)
            q, k = rotate(q, angles), rotate(k, angles)
        out = F.scaled_dot_product_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                             attn_mask=self._key_mask(x, hw, valid),
                                             dropout_p=self.attn_drop if self.training else 0.)
        out = out.reshape(B, num_windows, heads, T, head_dim).transpose(2, 3).reshape(B, num_windows, T, C)
        return self.merge(out, grid, hw)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
                valid: ValidRegion | None = None) -> torch.Tensor:
        return self.proj_drop(self.proj(self.attend(x, hw, pos, valid)))

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}, window_mask={self.window_mask}'
