"""What the columnar and the pyramid CPVT share: input checks, the constructor skeleton (outputs, position
encodings, freezing), weight init, running the blocks, checkpointing."""
import math
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers.position import Geometry, PositionEncoding, build_position_encodings, merge_attention


def check_input(x, in_chans: int, check_finite: bool = False) -> None:
    """Raise a clear error for anything but a non-empty floating-point (B, in_chans, H, W) tensor; with
    ``check_finite`` also for NaN or Inf values (a full pass over the input, hence opt-in)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'expected a torch.Tensor of shape (B, {in_chans}, H, W), got {type(x).__name__}')
    if x.ndim != 4:
        raise ValueError(f'expected a 4-D NCHW tensor of shape (B, {in_chans}, H, W), got shape {tuple(x.shape)}')
    if not x.is_floating_point():
        raise TypeError(f'expected a floating-point tensor (float32, float16 or bfloat16), got {x.dtype}; '
                        'convert images with x.float() and normalise them first')
    if x.shape[1] != in_chans:
        raise ValueError(f'expected {in_chans} input channels (B, {in_chans}, H, W), got shape {tuple(x.shape)}')
    if 0 in x.shape:
        raise ValueError(f'expected a non-empty batch with H, W >= 1, got shape {tuple(x.shape)}')
    if check_finite and not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).sum().item()
        raise ValueError(f'input of shape {tuple(x.shape)} contains {bad} NaN or Inf values; expected finite '
                         'floats (check_finite=True)')


def check_out_indices(out_indices: Sequence[int], num_outputs: int) -> Tuple[int, ...]:
    out = tuple(out_indices)
    if not out or any(not isinstance(i, int) or isinstance(i, bool) for i in out):
        raise ValueError(f'out_indices must be a non-empty sequence of ints, got {out_indices!r}')
    if any(not 0 <= i < num_outputs for i in out) or len(set(out)) != len(out) or list(out) != sorted(out):
        raise ValueError(f'out_indices must be increasing, distinct and within 0..{num_outputs - 1}, '
                         f'got {out_indices!r}')
    return out


def take_indices(num: int, indices: Union[None, int, Sequence[int]]) -> Tuple[List[int], int]:
    """timm's ``indices`` convention for intermediate features: None = all ``num``, an int n = the last n, a
    sequence = those (negative ones count from the end). Returns the absolute indices and the largest."""
    if indices is None:
        indices = num
    if isinstance(indices, int):
        if not 0 < indices <= num:
            raise ValueError(f'indices={indices} asks for the last {indices} of {num} feature levels')
        taken = list(range(num - indices, num))
    else:
        taken = [i + num if i < 0 else i for i in indices]
        if not taken or any(not 0 <= i < num for i in taken):
            raise ValueError(f'indices must pick feature levels within -{num}..{num - 1}, got {indices!r}')
    return taken, max(taken)


def init_weights(m: nn.Module) -> None:
    """The Twins/timm initialisation, so that training from scratch matches the official recipe."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Conv2d):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
        nn.init.normal_(m.weight, 0., math.sqrt(2. / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)


class CPVTBase(nn.Module):
    """The constructor skeleton and behaviour both models share. A subclass's ``__init__`` calls
    ``_setup_outputs`` (classifier or dense backbone), ``_setup_position`` (the position encodings, mounted
    under their ``attr`` names) and ends with ``_finish_init(frozen, ...)`` (init, freezing). A stage runs as
    ``_embed_position`` (after its patch embedding) then ``_run_blocks``. The attributes mean the same in both
    models:

    * ``out_indices``, ``out_channels``, ``strides``: for a dense backbone, the levels it returns, their
      channels and strides (aligned; all empty for a classifier);
    * ``pos_encodings``: the position-encoding modules (``layers.position``), in the order they act;
    * ``peg_after``: ``{(stage, block): k}``, PEG ``pos_block.{k}`` follows that block (a columnar model
      has one stage, 0; empty without a PEG);
    * ``num_features``: channels of the pooled features the head sees (timm's meaning);
    * ``feature_info``: timm's list of taps ``forward_intermediates`` can return (``module``, ``num_chs``,
      ``reduction``): the stages of a pyramid model, the blocks of a columnar one;
    * ``unbuilt_prefixes``: the key prefixes of the full classification layout that an instance does not
      build (a dense backbone has no head; a truncated one no later stages): checkpoint loading drops exactly
      these and nothing else.
    """

    in_chans: int
    check_finite: bool
    features_only: bool
    num_classes: int
    out_indices: Tuple[int, ...]
    out_channels: Tuple[int, ...]
    strides: Tuple[int, ...]
    pos_encoding_attrs: Tuple[str, ...]
    num_features: int
    feature_info: List[Dict[str, object]]
    unbuilt_prefixes: Tuple[str, ...]

    def _setup_outputs(self, features_only: bool, num_classes: int, out_indices: Optional[Sequence[int]],
                       num_levels: int) -> None:
        """A classifier (``out_indices=()``), or a dense backbone returning ``out_indices`` of ``num_levels``
        maps (default: all)."""
        if features_only:
            if num_classes:
                raise ValueError('features_only=True builds no classifier: pass num_classes=0')
            out_indices = tuple(range(num_levels)) if out_indices is None else out_indices
            self.out_indices = check_out_indices(out_indices, num_levels)
        else:
            if out_indices is not None:
                raise ValueError('out_indices selects feature maps and needs features_only=True')
            self.out_indices = ()
        self.features_only = features_only
        self.num_classes = num_classes

    def _setup_position(self, geometry: Geometry, pos_encoding, built_depths: Sequence[int]) -> List[str]:
        """Build the encodings ``pos_encoding`` names for the whole ``geometry``, mount each under its
        ``attr``, and keep only the parts of the first ``built_depths[i]`` blocks of every stage (a dense
        backbone builds no stage beyond its last output); returns the dropped key prefixes."""
        encodings = build_position_encodings(pos_encoding, geometry)
        for enc in encodings:
            if hasattr(self, enc.attr):
                raise ValueError(f'position encoding {enc.name!r} would replace the model\'s {enc.attr!r}')
            setattr(self, enc.attr, enc)
        self.pos_encoding_attrs = tuple(enc.attr for enc in encodings)
        return self._cut_position(built_depths) if tuple(built_depths) != geometry.depths else []

    @property
    def pos_encodings(self) -> List[PositionEncoding]:
        return [getattr(self, attr) for attr in self.pos_encoding_attrs]

    @property
    def peg_after(self) -> Dict[Tuple[int, int], int]:
        peg = getattr(self, 'pos_block', None)
        return dict(peg.peg_after) if peg is not None else {}

    def _position_parts(self, stage: int, blocks: Iterable[int], embedding: bool = False) -> List:
        """The position-encoding parts tied to these blocks of ``stage`` (and its patch embedding): what
        freezing them also freezes."""
        blocks = list(blocks)
        return [part for enc in self.pos_encodings for part in enc.parts_of(stage, blocks, embedding)]

    def _cut_position(self, kept_depths: Sequence[int]) -> List[str]:
        """Drop the encodings' parts beyond the first ``kept_depths[i]`` blocks of each stage; returns the
        dropped key prefixes (``attr.``-qualified)."""
        return [f'{enc.attr}.{key}' for enc in self.pos_encodings for key in enc.cut(kept_depths)]

    def _embed_position(self, stage: int, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        for enc in self.pos_encodings:
            x = enc.embed(stage, x, hw)
        return x

    def _run_blocks(self, blocks: nn.ModuleList, stage: int, x: torch.Tensor, hw: Tuple[int, int],
                    tap: Optional[Callable[[int, torch.Tensor], None]] = None,
                    stop: Optional[int] = None) -> torch.Tensor:
        """Blocks 0..``stop`` (all by default), each given its attention's position input and followed by the
        encodings' ``after_block`` (a PEG); ``tap(j, x)`` sees the tokens after block j and its PEG."""
        encodings = self.pos_encodings
        per_block = [enc.attention(stage, hw) for enc in encodings]
        names = [enc.name for enc in encodings]
        for j, blk in enumerate(blocks):
            if stop is not None and j > stop:
                break
            pos = merge_attention([p[j] if p is not None else None for p in per_block], names)
            x = self._block(blk, x, hw, pos)
            for enc in encodings:
                x = enc.after_block(stage, j, x, hw)
            if tap is not None:
                tap(j, x)
        return x

    def _cut_to(self, keep: int) -> List[str]:
        """Keep the first ``keep`` taps of ``feature_info`` (stages or blocks) and the PEGs after them; return
        the key prefixes of what was dropped (subclasses)."""
        raise NotImplementedError

    def prune_intermediate_layers(self, indices: Union[None, int, Sequence[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """timm's pruning: keep the taps up to the last one ``indices`` picks (``take_indices``), and drop the
        head and the final norm where asked or where the cut left them sized for features that are gone.
        Returns the absolute indices."""
        if self.features_only:
            raise ValueError('prune_intermediate_layers applies to a classifier; a features_only model already '
                             'builds nothing beyond max(out_indices)')
        take, max_index = take_indices(len(self.feature_info), indices)
        keep = max_index + 1
        dropped = self._cut_to(keep)
        self.feature_info = self.feature_info[:keep]
        if prune_norm or dropped:
            self.norm = nn.Identity()
            dropped.append('norm.')
        self.num_features = self.feature_info[-1]['num_chs']
        if prune_head or dropped:
            self.reset_classifier(0)
        self.unbuilt_prefixes = tuple(dict.fromkeys(self.unbuilt_prefixes + tuple(dropped)))
        return take

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int) -> None:
        """A fresh linear head for ``num_classes`` (0: none, ``forward`` returns the pooled features), with
        torch's default init, as timm's ``reset_classifier``."""
        if self.features_only:
            raise ValueError('a features_only model has no classifier')
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()
        rest = tuple(p for p in self.unbuilt_prefixes if p != 'head.')
        self.unbuilt_prefixes = rest if num_classes else rest + ('head.',)

    def _finish_init(self, frozen: List, grad_checkpointing: bool) -> None:
        self.apply(init_weights)
        self.grad_checkpointing = grad_checkpointing
        self._frozen = frozen
        for item in frozen:
            params = [item] if isinstance(item, nn.Parameter) else item.parameters()
            for p in params:
                p.requires_grad_(False)

    def train(self, mode: bool = True):
        """Frozen parts stay in eval mode (no dropout / stochastic depth) even while the rest trains."""
        super().train(mode)
        for item in self._frozen:
            if isinstance(item, nn.Module):
                item.eval()
        return self

    def _check_input(self, x) -> None:
        check_input(x, self.in_chans, self.check_finite)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def _block(self, blk: nn.Module, x: torch.Tensor, hw: Tuple[int, int], pos) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(blk, x, hw, pos, use_reentrant=False)
        return blk(x, hw, pos)

    def no_weight_decay(self) -> Set[str]:
        """Names of parameters that the recipes exclude from weight decay: every position encoding's (PEG, as
        Twins; tables, biases and RoPE frequencies, as DeiT, Swin and RoPE-ViT) and the class token."""
        prefixes = tuple(f'{attr}.' for attr in self.pos_encoding_attrs)
        names = {n for n, _ in self.named_parameters() if n.startswith(prefixes)}
        return names | ({'cls_token'} if getattr(self, 'cls_token', None) is not None else set())
