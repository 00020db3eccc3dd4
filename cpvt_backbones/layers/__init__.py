"""Building blocks of the CPVT models (torch only)."""
from .attention import Attention, LocallyGroupedAttention
from .block import Block, DropPath, LayerScale, Mlp
from .layout import map_to_tokens, pad_to_multiple, tokens_to_map
from .mlp import ConvMlp
from .norm import LayerNorm2d
from .patch_embed import PatchEmbed
from .position import ENCODINGS, PEG, PEG_TYPES, Geometry, PositionEncoding, build_position_encodings

__all__ = ['Attention', 'Block', 'ConvMlp', 'DropPath', 'ENCODINGS', 'Geometry', 'LayerNorm2d', 'LayerScale',
           'LocallyGroupedAttention', 'Mlp', 'PEG', 'PEG_TYPES', 'PatchEmbed', 'PositionEncoding',
           'build_position_encodings', 'map_to_tokens', 'pad_to_multiple', 'tokens_to_map']
