"""Multi-head attention: global with optional spatial reduction of keys and values (PVT's SRA, Twins' GSA, PVTv2-li's
pooling), and within windows of the token map (Twins' LSA)."""
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .layout import map_to_tokens, pad_to_at_least, pad_to_multiple, symbolic_shapes, tokens_to_map
from .position.base import AttentionPosition, rotate
from .valid import WHOLE, Region

REDUCTIONS = ('pad', 'drop', 'pool')


class Attention(nn.Module):
    """Multi-head self-attention whose keys and values come from a reduced map (PVT's spatial reduction).

    ``reduction`` says how the token map is reduced before the key/value projection:

    * ``'pad'``: with ``sr_ratio > 1`` a kernel = stride = ``sr_ratio`` convolution and a norm over the map
      zero-padded bottom/right to a multiple of ``sr_ratio``: ceil(h / sr) x ceil(w / sr) keys, every row and
      column of the input represented, any map size (even 1 x 1);
    * ``'drop'``: the same convolution without padding: h // sr x w // sr keys, the remainder dropped; a side
      shorter than ``sr_ratio`` is padded to one cell;
    * ``'pool'``: adaptive average pooling to ``pool_size`` x ``pool_size`` cells (``adaptive_pool``), a 1 x 1
      convolution, a norm and GELU: a fixed number of keys at any size.

    ``pos``: an encoding's ``AttentionPosition`` (a bias only with ``'pad'``). ``region`` (``layers.valid``): the
    tokens beyond each image are zeroed before the reduction and excluded as keys (a reduced key is kept where it
    covers the image), so each image's valid queries attend as they would alone.

    Keys ``q``, ``kv``, ``sr``, ``norm``, ``proj`` as the official weights. The reduction's norm is
    ``norm_layer(dim)`` at its default eps. A ValueError where ``num_heads`` does not divide ``dim``, ``sr_ratio``
    is below 1 or ``reduction`` is not in ``REDUCTIONS``.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0., sr_ratio: int = 1, norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
                 reduction: str = 'pad', pool_size: int = 7):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} must be divisible by num_heads {num_heads}')
        if sr_ratio < 1:
            raise ValueError(f'sr_ratio must be >= 1, got {sr_ratio}')
        if reduction not in REDUCTIONS:
            raise ValueError(f'reduction must be one of {REDUCTIONS}, got {reduction!r}')
        self.num_heads = num_heads
        self.sr_ratio = sr_ratio
        self.reduction = reduction
        self.pool_size = pool_size
        self.attn_drop = attn_drop
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if reduction == 'pool':
            self.sr = nn.Conv2d(dim, dim, kernel_size=1)
            self.norm = norm_layer(dim)
            self.act = nn.GELU()
        elif sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = norm_layer(dim)

    def _reduce(self, x: torch.Tensor, hw: tuple[int, int], region: Region) -> tuple[torch.Tensor, Region]:
        """The key/value tokens from the (zeroed) tokens ``x`` and their region."""
        if self.reduction == 'pool':
            pooled = adaptive_pool(tokens_to_map(x, hw), self.pool_size, region)
            return self.act(self.norm(map_to_tokens(self.sr(pooled)))), WHOLE
        if self.sr_ratio == 1:
            return x, region
        m = tokens_to_map(x, hw)
        m = pad_to_multiple(m, self.sr_ratio) if self.reduction == 'pad' else pad_to_at_least(m, self.sr_ratio)
        m = self.sr(m)
        return self.norm(map_to_tokens(m)), region.reduced(self.sr_ratio, m.shape[-2:], self.reduction == 'drop')

    def attend(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
               region: Region = WHOLE) -> torch.Tensor:
        """Attention output before the output projection, (B, N, C)."""
        B, N, C = x.shape
        x = region.zero_tokens(x)
        separate_qk = pos is not None and pos.qk_input is not None
        qk_input = region.zero_tokens(pos.qk_input(x, hw, region)) if separate_qk else x
        q = self.q(qk_input).reshape(B, N, self.num_heads, C // self.num_heads).transpose(1, 2)
        reduced, keys = self._reduce(x, hw, region)
        k, v = self.kv(reduced).reshape(B, reduced.shape[1], 2, self.num_heads, C // self.num_heads
                                        ).permute(2, 0, 3, 1, 4)
        if separate_qk:
            reduced = self._reduce(qk_input, hw, region)[0]
            k = self.kv(reduced)[..., :C].reshape(B, reduced.shape[1], self.num_heads, -1).transpose(1, 2)
        bias = None
        if pos is not None:
            if pos.rotary is not None:
                q, k = rotate(q, pos.rotary.query), rotate(k, pos.rotary.key)
            if pos.bias is not None:
                bias = pos.bias.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys.attention_mask(bias),
                                             dropout_p=self.attn_drop if self.training else 0.)
        return out.transpose(1, 2).reshape(B, N, C)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
                region: Region = WHOLE) -> torch.Tensor:
        return self.proj_drop(self.proj(self.attend(x, hw, pos, region)))

    def extra_repr(self) -> str:
        return f'sr_ratio={self.sr_ratio}, reduction={self.reduction!r}'


def adaptive_pool(x: torch.Tensor, size: int, region: Region) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, size)`` of each image's own region of the (B, C, H, W) map ``x`` (the whole
    map for a ``WholeRegion``), as two matrix products (exportable at any size): output cell i of a side of n
    cells averages cells floor(i * n / size) .. ceil((i + 1) * n / size) - 1, torch's bins."""
    H, W = x.shape[-2:]
    sizes = region.sizes if region.padded else _map_size(x)   # the whole map
    rows, cols = _pool_weights(sizes[:, 0], size, H, x.dtype), _pool_weights(sizes[:, 1], size, W, x.dtype)
    return torch.einsum('bih,bchw,bjw->bcij', rows, x, cols)


def _map_size(x: torch.Tensor) -> torch.Tensor:
    """[[H, W]] of the (B, C, H, W) map ``x`` as a (1, 2) int64 tensor that exporters record as a function of the
    input's size, not as a constant."""
    h, w = (torch.arange(n, device=x.device)[-1:] + 1 for n in x.shape[-2:])
    return torch.stack((h, w), dim=1)


def _pool_weights(n: torch.Tensor, size: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, size, length): row i averages the cells of bin i of a side of ``n[b]`` cells (zero beyond it)."""
    i = torch.arange(size, device=n.device)[None, :, None]
    start = torch.div(i * n[:, None, None], size, rounding_mode='floor')
    end = torch.div((i + 1) * n[:, None, None] + size - 1, size, rounding_mode='floor')
    cells = torch.arange(length, device=n.device)[None, None, :]
    inside = (cells >= start) & (cells < end)
    return inside.to(dtype) / (end - start).to(dtype)


class LocallyGroupedAttention(nn.Module):
    """Multi-head self-attention within non-overlapping ``window_size`` x ``window_size`` windows of the token
    map (Twins' locally-grouped self-attention, LSA).

    The map is zero-padded bottom/right to whole windows, so any H x W works; the outputs of padded tokens are
    dropped. ``window_mask=False``: padded tokens take part as keys and values (zero inputs: the projection's
    biases); ``window_mask=True``: they are masked out as keys (docs/reference.md compares both with timm and
    mmseg).

    ``region`` (``layers.valid``): the tokens beyond each image are zeroed before the partition, so an image's
    windows hold what they hold alone (with ``window_mask`` its padding masked out as keys).

    Takes ``layers.Block``'s ``attn_layer`` arguments: ``sr_ratio`` must be 1 (a ValueError otherwise) and
    ``norm_layer`` builds nothing. Of an ``AttentionPosition`` it takes the query/key input and rotary angles
    (queries and keys turn by the queries' angles; padded tokens by 0); a bias raises a ValueError. Keys ``qkv``
    (queries, keys, values stacked) and ``proj``, as the official weights.
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

    def _key_mask(self, x: torch.Tensor, hw: tuple[int, int], region: Region) -> torch.Tensor | None:
        """(B * windows, 1, 1, window_size ** 2) True for the real tokens of each window, or None where there
        is nothing to mask (no mask asked for, or no padding in an eager call on a ``WholeRegion``). A
        window of a padded batch that holds no token of its image keeps every key (its outputs are dropped)."""
        ws = self.window_size
        if not self.window_mask:
            return None
        if region.padded:   # each image's own windows
            real = self.partition(region.map_mask().to(x.dtype))[0][..., 0] > 0
            real = real | ~real.any(dim=-1, keepdim=True)
            return real[:, :, None, None, :].flatten(0, 1)
        if not (symbolic_shapes() or hw[0] % ws or hw[1] % ws):
            return None
        real = self.partition(x.new_ones(1, 1, hw[0], hw[1]))[0][..., 0] > 0
        return real[:, :, None, None, :].expand(x.shape[0], -1, -1, -1, -1).flatten(0, 1)

    def _angles(self, angles: torch.Tensor, hw: tuple[int, int], region: Region) -> torch.Tensor:
        """Rotary angles (heads or 1, H * W, d) as windows broadcasting against (B, windows, heads, T, d)
        queries: zero on padded tokens (those of a batch's padding beyond each image too)."""
        if not region.padded:   # one set of windows for the batch
            return self.partition(tokens_to_map(angles, hw))[0].transpose(0, 1)      # (windows, heads, T, d)
        heads, _, d = angles.shape
        per_image = (angles[None] * region.token_mask()[:, None, :, None]).flatten(0, 1)  # (B * heads, H * W, d)
        windows = self.partition(tokens_to_map(per_image, hw))[0]                     # (B * heads, windows, T, d)
        return windows.unflatten(0, (-1, heads)).transpose(1, 2)                       # (B, windows, heads, T, d)

    def attend(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
               region: Region = WHOLE) -> torch.Tensor:
        """Attention output before the output projection, (B, N, C)."""
        B, N, C = x.shape
        heads, head_dim = self.num_heads, C // self.num_heads
        if pos is not None and pos.bias is not None:
            raise ValueError('an attention-logit bias (rpe) is sized for global attention and has no place in '
                             'locally-grouped (windowed) attention')
        x = region.zero_tokens(x)
        windows, grid = self.partition(tokens_to_map(x, hw))
        num_windows, T = windows.shape[1], windows.shape[2]
        q, k, v = self._split_heads(self.qkv(windows), 3)
        if pos is not None and pos.qk_input is not None:
            qk = pos.qk_input(x, hw, region)
            qk_windows = self.partition(tokens_to_map(region.zero_tokens(qk), hw))[0]
            q, k = self._split_heads(self.qkv(qk_windows)[..., :2 * C], 2)
        if pos is not None and pos.rotary is not None:
            angles = self._angles(pos.rotary.query, hw, region)
            q, k = rotate(q, angles), rotate(k, angles)
        out = F.scaled_dot_product_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                             attn_mask=self._key_mask(x, hw, region),
                                             dropout_p=self.attn_drop if self.training else 0.)
        out = out.reshape(B, num_windows, heads, T, head_dim).transpose(2, 3).reshape(B, num_windows, T, C)
        return self.merge(out, grid, hw)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
                region: Region = WHOLE) -> torch.Tensor:
        return self.proj_drop(self.proj(self.attend(x, hw, pos, region)))

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}, window_mask={self.window_mask}'
