"""Building blocks of the CPVT models (torch only)."""
from .attention import Attention
from .block import Block, DropPath, Mlp
from .fused import FusedBlock, FusedLinear
from .layout import map_to_tokens, pad_to_multiple, tokens_to_map
from .norm import LayerNorm2d
from .patch_embed import PatchEmbed
from .peg import PEG, PEG_TYPES

__all__ = ['Attention', 'Block', 'DropPath', 'FusedBlock', 'FusedLinear', 'LayerNorm2d', 'Mlp', 'PEG', 'PEG_TYPES',
           'PatchEmbed', 'map_to_tokens', 'pad_to_multiple', 'tokens_to_map']
