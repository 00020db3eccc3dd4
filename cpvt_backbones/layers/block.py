"""Pre-norm transformer encoder block built from parts (attention, MLP, norm), its MLP, layer scale and
stochastic depth."""
from collections.abc import Callable

import torch
from torch import nn

from .attention import Attention
from .position.base import AttentionPosition
from .valid import WHOLE, Region


class DropPath(nn.Module):
    """Stochastic depth: drops the whole residual branch per sample while training."""

    def __init__(self, drop_prob: float = 0.):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0. or not self.training:
            return x
        keep = 1. - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (CaiT), ``gamma`` initialised to ``init``."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """``fc2(act(fc1(x)))`` with dropout after the activation and after ``fc2``; keys ``fc1``, ``fc2``."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0., act_layer: Callable[..., nn.Module] = nn.GELU):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """``x + ls1(attn(norm1(x)))`` then ``x + ls2(mlp(norm2(x)))``; keys ``norm1``, ``attn``, ``norm2``,
    ``mlp`` (and ``ls1.gamma``/``ls2.gamma`` with ``layer_scale_init``; otherwise ``ls1``/``ls2`` are
    identities).

    The parts are passed by keyword: ``attn_layer(dim, num_heads, qkv_bias=, attn_drop=, proj_drop=,
    sr_ratio=, norm_layer=)``, ``mlp_layer(dim, hidden_dim, drop=, act_layer=)``, ``norm_layer(dim, eps=)``.
    ``pos`` (from the model's position encodings) and ``region`` (``layers.valid``: a padded batch's ``ValidRegion``
    or a ``WholeRegion``) go to the attention, which zeroes its input beyond each image. An MLP whose class sets
    ``takes_grid = True`` (``layers.mlp.ConvMlp``) is called as ``mlp(x, hw, region)`` and zeroes what it
    convolves; any other as ``mlp(x)``. The tokens beyond each image leave the block as they come out (every
    layer that mixes positions zeroes its own input).
    ``drop`` is the dropout of the attention's projection and of the MLP, ``drop_path`` the stochastic depth of
    both branches.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4., *, qkv_bias: bool = True, drop: float = 0.,
                 attn_drop: float = 0., drop_path: float = 0., sr_ratio: int = 1, norm_eps: float = 1e-6,
                 layer_scale_init: float | None = None, attn_layer: Callable[..., nn.Module] = Attention,
                 mlp_layer: Callable[..., nn.Module] = Mlp, norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
                 act_layer: Callable[..., nn.Module] = nn.GELU):
        super().__init__()
        self.norm1 = norm_layer(dim, eps=norm_eps)
        self.attn = attn_layer(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop,
                               sr_ratio=sr_ratio, norm_layer=norm_layer)
        self.ls1 = nn.Identity() if layer_scale_init is None else LayerScale(dim, layer_scale_init)
        self.norm2 = norm_layer(dim, eps=norm_eps)
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio), drop=drop, act_layer=act_layer)
        self.ls2 = nn.Identity() if layer_scale_init is None else LayerScale(dim, layer_scale_init)
        self.drop_path = DropPath(drop_path)
        self.mlp_takes_grid = getattr(self.mlp, 'takes_grid', False)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], pos: AttentionPosition | None = None,
                region: Region = WHOLE) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x), hw, pos, region)))
        y = self.norm2(x)
        return x + self.drop_path(self.ls2(self.mlp(y, hw, region) if self.mlp_takes_grid else self.mlp(y)))
