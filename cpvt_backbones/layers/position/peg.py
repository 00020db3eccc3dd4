"""Positional Encoding Generator (PEG), the conditional positional encoding of CPVT, as an encoding."""
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..layout import map_to_tokens, tokens_to_map
from ..valid import WHOLE, Region
from .base import HW, Geometry, Placed, PositionEncoding, check_odd_kernel, check_positions

PEG_TYPES = ('depthwise', 'separable')
PADDING_MODES = ('zeros', 'circular', 'replicate', 'reflect')


class PEG(nn.Module):
    """Adds a zero-padded convolution of the token map to the tokens.

    The tokens are laid back out as a (B, C, H, W) map, any H x W, and its k x k depthwise convolution (padding
    k // 2) is added; the leading ``num_prefix_tokens`` (a class token) bypass it.

    ``peg_type='separable'`` follows the depthwise convolution with a pointwise one (``proj.1``). Keys
    ``proj.0.*`` as the official Twins/CPVT and timm weights. ``kernel_size`` 1 is the ``conv1x1`` control; a
    PEG proper has k >= 3 (the ``peg`` encoding checks it). ``padding_mode`` other than 'zeros' ('circular',
    'replicate', 'reflect') leaves no zero border ('circular' and 'reflect' need maps of at least k // 2 + 1
    tokens per side). A ValueError for an even ``kernel_size`` or an unknown type or mode.

    ``region`` (``layers.valid``): on a padded batch's ``ValidRegion`` each image's convolution sees its own
    border: zeros beyond it (the input is zeroed there first) or, with another ``padding_mode``, the image's own
    map padded that way.
    """

    def __init__(self, dim: int, kernel_size: int = 3, peg_type: str = 'depthwise', num_prefix_tokens: int = 0,
                 padding_mode: str = 'zeros'):
        super().__init__()
        check_odd_kernel(kernel_size, 'kernel_size')
        if peg_type not in PEG_TYPES:
            raise ValueError(f'peg_type must be one of {PEG_TYPES}, got {peg_type!r}')
        if padding_mode not in PADDING_MODES:
            raise ValueError(f'padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}')
        layers = [nn.Conv2d(dim, dim, kernel_size, 1, kernel_size // 2, groups=dim, padding_mode=padding_mode)]
        if peg_type == 'separable':
            layers.append(nn.Conv2d(dim, dim, 1))
        self.proj = nn.Sequential(*layers)
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, x: torch.Tensor, hw: HW, region: Region = WHOLE) -> torch.Tensor:
        prefix = self.num_prefix_tokens
        # masked as tokens (contiguous), not as the channels-last map: an exported graph then keeps H and W free
        feat = tokens_to_map(region.zero_tokens(x)[:, prefix:], hw)
        if region.padded and self.proj[0].padding_mode != 'zeros':   # each image padded its own way
            conv = torch.stack([F.pad(self.proj(feat[b:b + 1, :, :h, :w])[0], (0, hw[1] - w, 0, hw[0] - h))
                                for b, (h, w) in enumerate(region.images())])
        else:
            conv = self.proj(feat)
        out = map_to_tokens(conv + feat)
        return torch.cat((x[:, :prefix], out), dim=1) if prefix else out

    def response(self, x: torch.Tensor, out: torch.Tensor, hw: HW) -> torch.Tensor:
        """What this PEG added to each patch token, given its forward's input ``x`` and output ``out``: the L2
        norm over channels of its convolution's output, as a (B, h, w) map."""
        prefix = self.num_prefix_tokens
        return (out - x)[:, prefix:].norm(dim=-1).reshape(x.shape[0], *hw)


def peg_responses(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """``PEG.response`` of every PEG of ``model`` (``pos_block``, in network order) on input ``x``, read through
    forward hooks that are removed afterwards."""
    responses = []
    hooks = [peg.register_forward_hook(lambda module, args, out: responses.append(
        module.response(args[0].detach(), out.detach(), tuple(args[1])))) for peg in getattr(model, 'pos_block', ())]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return responses


class PEGEncoding(Placed, PositionEncoding):
    """``peg``: a PEG after each block in ``positions`` (per stage; default: the first block of every stage).
    Position -1 puts one on the patch embedding's output,
    before block 0. PEGs are ``pos_block.{k}``, numbered in network order (``peg_after[(stage, block)] = k``).

    ``kernel_size`` (odd, >= 3), ``peg_type`` ('depthwise' or 'separable'); ``frozen=True`` keeps the PEGs at
    their random initialisation (no gradient); ``padding_mode`` ('zeros', 'circular', 'replicate' or 'reflect').
    """
    attr = 'pos_block'
    name = 'peg'
    min_kernel = 3

    def __init__(self, geometry: Geometry, positions=None, kernel_size: int = 3, peg_type: str = 'depthwise',
                 frozen: bool = False, padding_mode: str = 'zeros'):
        super().__init__(geometry)
        check_odd_kernel(kernel_size, f'{self.name} kernel_size', self.min_kernel)
        if not isinstance(frozen, bool):
            raise TypeError(f'{self.name} frozen must be True or False, got {frozen!r}')
        self.positions = check_positions(positions, geometry.depths, f'{self.name} positions', self.default_positions,
                                         first=-1)
        self.kernel_size, self.peg_type, self.frozen, self.padding_mode = kernel_size, peg_type, frozen, padding_mode
        places = [(s, b) for s, blocks in enumerate(self.positions) for b in blocks]
        self._place(places, [PEG(geometry.dims[s], kernel_size, peg_type, geometry.num_prefix_tokens, padding_mode)
                             for s, _ in places])
        if frozen:
            self.requires_grad_(False)

    @staticmethod
    def default_positions(depth: int) -> Sequence[int]:
        return (0,)

    @property
    def peg_after(self) -> dict[tuple[int, int], int]:
        """``{(stage, block): k}``: PEG ``pos_block.{k}`` follows that block (block -1: the patch embedding)."""
        return {place: k for k, place in enumerate(self.places)}

    def _apply_at(self, stage: int, block: int, x: torch.Tensor, hw: HW, region: Region) -> torch.Tensor:
        peg = self.at(stage, block)
        return x if peg is None else peg(x, hw, region)

    def embed(self, stage: int, x: torch.Tensor, hw: HW, region: Region) -> torch.Tensor:
        return self._apply_at(stage, -1, x, hw, region)

    def after_block(self, stage: int, block: int, x: torch.Tensor, hw: HW, region: Region) -> torch.Tensor:
        return self._apply_at(stage, block, x, hw, region)

    def parts_of(self, stage: int, blocks: Sequence[int], embedding: bool = False) -> list[nn.Module]:
        return self.placed_parts(stage, list(blocks) + ([-1] if embedding else []))

    def cut(self, kept_depths: Sequence[int]) -> list[str]:
        return self.keep_placed(kept_depths)

    def extra_repr(self) -> str:
        where = ';'.join(','.join(map(str, p)) for p in self.positions)
        extra = (f', {self.kernel_size}x{self.kernel_size}' if self.kernel_size != 3 else '') + \
            (', separable' if self.peg_type == 'separable' else '') + (', frozen' if self.frozen else '') + \
            (f', {self.padding_mode} padding' if self.padding_mode != 'zeros' else '')
        return f'{self.name} after {where}{extra}'


__all__ = ['PADDING_MODES', 'PEG', 'PEGEncoding', 'PEG_TYPES', 'peg_responses']
