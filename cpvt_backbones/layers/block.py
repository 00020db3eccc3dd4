"""Pre-norm transformer encoder block, its MLP and stochastic depth."""
from typing import Tuple

import torch
from torch import nn

from .attention import Attention


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


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``; keys ``norm1``, ``attn``, ``norm2``, ``mlp``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool = True, drop: float = 0.,
                 attn_drop: float = 0., drop_path: float = 0., sr_ratio: int = 1, norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop, sr_ratio)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))
