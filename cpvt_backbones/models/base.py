"""What the columnar and the pyramid CPVT share: input checks, the constructor's arguments and build order
(trunk, position encodings, outputs, freezing), weight init, running the blocks, checkpointing."""
import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..compat import autocast_enabled, is_fx_tracing
from ..layers import Attention, Block, Mlp
from ..layers.layout import symbolic_shapes
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
    if min(x.shape) == 0:
        raise ValueError(f'expected a non-empty batch with H, W >= 1, got shape {tuple(x.shape)}')
    if check_finite and not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).sum().item()
        raise ValueError(f'input of shape {tuple(x.shape)} contains {bad} NaN or Inf values; expected finite '
                         'floats (check_finite=True)')


def check_out_indices(out_indices: int | Sequence[int], num_outputs: int) -> tuple[int, ...]:
    """``out_indices`` as a tuple (an int is one level, as mmdet's backbones take it), or a clear error."""
    out = (out_indices,) if isinstance(out_indices, int) and not isinstance(out_indices, bool) else \
        tuple(out_indices) if isinstance(out_indices, Sequence) else None
    if out is None:
        raise ValueError(f'out_indices must be an int or a non-empty sequence of ints, got {out_indices!r}')
    if not out or any(not isinstance(i, int) or isinstance(i, bool) for i in out):
        raise ValueError(f'out_indices must be a non-empty sequence of ints, got {out_indices!r}')
    if any(not 0 <= i < num_outputs for i in out) or len(set(out)) != len(out) or list(out) != sorted(out):
        raise ValueError(f'out_indices must be increasing, distinct and within 0..{num_outputs - 1}, '
                         f'got {out_indices!r}')
    return out


def take_indices(num: int, indices: None | int | Sequence[int]) -> tuple[list[int], int]:
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


@dataclass(frozen=True)
class Stage:
    """One stage of a model's trunk: a patch embedding of stride ``patch_size`` over the previous map (the
    image for the first stage), then ``depth`` blocks of width ``dim`` with ``num_heads`` heads, MLP hidden
    width ``dim * mlp_ratio`` and keys/values reduced ``sr_ratio`` times per side."""
    dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    patch_size: int
    sr_ratio: int = 1


# CPVTBase's arguments that a model derives from its own (its trunk), not for users.
_TRUNK_ARGUMENTS = ('stages', 'num_levels', 'num_prefix_tokens')


class CPVTBase(nn.Module):
    """What the columnar and the pyramid CPVT share: the arguments below, the build order, and the behaviour
    that follows from them. A model passes its trunk as a list of ``Stage`` and implements four steps that
    ``__init__`` runs in this order: ``_build_trunk`` (patch embeddings, blocks and whatever else sits before
    the position encodings; the blocks come from ``make_block``, which carries the shared arguments), then
    the position encodings are built for the whole trunk and mounted under their ``attr`` names,
    ``_build_outputs`` (final norm and head, or a dense backbone's extra layers; ``feature_info``), and
    ``_frozen_parts`` (what ``frozen_stages`` freezes). A stage runs as ``_embed_position`` (after its patch
    embedding) then ``_run_blocks``.

    Args:
        in_chans: channels of the input image.
        num_classes: classes of the linear head; 0 builds no head (``forward`` returns the pooled features).
            Must be 0 with ``features_only``.
        qkv_bias: bias on the query, key and value projections.
        drop_rate: dropout after the position encoding, in the attention's output projection and in the MLP.
        attn_drop_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth of the last block; it rises linearly from 0 at the first block over
            all blocks of all stages (built or not). This and the two dropout rates must be in [0, 1).
        norm_eps: eps of the blocks' two norms and the final norm (1e-6, as Twins and DeiT); the patch
            embedding's and the attention's reduction norm keep ``norm_layer``'s default (1e-5 for
            ``nn.LayerNorm``, as the official weights were trained).
        pos_encoding: the position encodings (``cpvt_backbones.layers.position``): a name (``'peg'``,
            ``'rope_mixed'``, ``'learned+peg'``, ``'none'``), a dict with ``type`` and the encoding's options
            (``dict(type='peg', positions=(0,), kernel_size=5)``) or a list of those.
        layer_scale_init: CaiT's layer scale on both residual branches of every block, initialised to this
            value (timm's RoPE ViTs use 1e-5); None for none.
        attn_layer: the blocks' attention, called ``attn_layer(dim, num_heads, qkv_bias=, attn_drop=,
            proj_drop=, sr_ratio=, norm_layer=)`` (``layers.Attention``).
        mlp_layer: the blocks' MLP, called ``mlp_layer(dim, hidden_dim, act_layer=, drop=)`` (``layers.Mlp``).
        norm_layer: every token norm, called ``norm_layer(dim, eps=)`` or ``norm_layer(dim)``: the blocks'
            two, the final norm, the patch embeddings' and the attention's reduction norm.
        act_layer: the activation of every MLP (``act_layer()``) and of the simple feature pyramid.
        features_only: build a dense backbone returning NCHW feature maps (``out_indices``) instead of a
            classifier: no head, and nothing the last returned map does not need.
        out_indices: with ``features_only``, the levels ``forward`` returns (increasing; an int is one level;
            default all).
        frozen_stages: -1 freezes nothing; 0 the first patch embedding (and class token, position table);
            k >= 1 also the first k stages (pyramid) or blocks (columnar) with their position-encoding parts.
            Frozen parts have ``requires_grad=False`` and stay in eval mode while the model trains.
        grad_checkpointing: recompute each block's activations in the backward pass (less memory, more time).
        check_finite: make ``forward`` raise a ValueError on NaN or Inf inputs (a pass over the input).

    Attributes, with the same meaning in both models:

    * ``out_indices``, ``out_channels``, ``strides``: for a dense backbone, the levels it returns, their
      channels and strides (aligned; all empty for a classifier);
    * ``pos_encodings``: the position-encoding modules (``layers.position``), in the order they act;
    * ``num_features``: channels of the pooled features the head sees (timm's meaning);
    * ``num_prefix_tokens``: leading tokens without a position (a class token);
    * ``stage_specs``: the trunk as ``Stage`` entries, including stages a dense backbone does not build;
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
    num_prefix_tokens: int
    stage_specs: tuple[Stage, ...]
    out_indices: tuple[int, ...]
    out_channels: tuple[int, ...]
    strides: tuple[int, ...]
    pos_encoding_attrs: tuple[str, ...]
    num_features: int
    feature_info: list[dict[str, object]]
    unbuilt_prefixes: tuple[str, ...]

    def __init__(self, stages: Sequence[Stage], *, num_levels: int, num_prefix_tokens: int = 0,
                 in_chans: int = 3, num_classes: int = 1000, qkv_bias: bool = True, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0., norm_eps: float = 1e-6,
                 pos_encoding: Any = 'peg', layer_scale_init: float | None = None,
                 attn_layer: Callable[..., nn.Module] = Attention, mlp_layer: Callable[..., nn.Module] = Mlp,
                 norm_layer: Callable[..., nn.Module] = nn.LayerNorm, act_layer: Callable[..., nn.Module] = nn.GELU,
                 features_only: bool = False, out_indices: Sequence[int] | None = None, frozen_stages: int = -1,
                 grad_checkpointing: bool = False, check_finite: bool = False):
        """``stages``: the trunk; ``num_levels``: how many feature maps a dense backbone can return;
        ``num_prefix_tokens``: class tokens. The rest are the shared arguments above."""
        super().__init__()
        self.stage_specs = tuple(stages)
        stages = self.stage_specs
        self.in_chans = in_chans
        self.check_finite = check_finite
        self.num_prefix_tokens = num_prefix_tokens
        self._setup_outputs(features_only, num_classes, out_indices, num_levels)
        built = stages[:self._num_built_stages(len(stages))]
        limit, unit = self._frozen_limit(built)
        if not -1 <= frozen_stages <= limit:
            raise ValueError(f'frozen_stages must be within -1..{limit} ({unit}), got {frozen_stages}')

        for name, rate in (('drop_rate', drop_rate), ('attn_drop_rate', attn_drop_rate),
                           ('drop_path_rate', drop_path_rate)):
            if not 0 <= rate < 1:
                raise ValueError(f'{name} must be in [0, 1) (the probability of dropping), got {rate!r}')
        drop_paths = torch.linspace(0, drop_path_rate, sum(s.depth for s in stages), device='cpu').tolist()
        make_block = partial(Block, qkv_bias=qkv_bias, drop=drop_rate, attn_drop=attn_drop_rate, norm_eps=norm_eps,
                             layer_scale_init=layer_scale_init, attn_layer=attn_layer, mlp_layer=mlp_layer,
                             norm_layer=norm_layer, act_layer=act_layer)
        starts = [sum(s.depth for s in stages[:i]) for i in range(len(stages))]
        stage_blocks = [[partial(make_block, s.dim, s.num_heads, mlp_ratio=s.mlp_ratio, sr_ratio=s.sr_ratio,
                                 drop_path=drop_paths[start + j]) for j in range(s.depth)]
                        for s, start in zip(built, starts)]
        self._build_trunk(built, stage_blocks, norm_layer=norm_layer, drop_rate=drop_rate)

        strides = [math.prod(s.patch_size for s in stages[:i + 1]) for i in range(len(stages))]
        geometry = Geometry(dims=tuple(s.dim for s in stages), depths=tuple(s.depth for s in stages),
                            heads=tuple(s.num_heads for s in stages), strides=tuple(strides),
                            sr_ratios=tuple(s.sr_ratio for s in stages), num_prefix_tokens=num_prefix_tokens)
        unbuilt = self._setup_position(geometry, pos_encoding, [s.depth for s in built])
        self._build_outputs(built, strides, unbuilt, norm_layer=partial(norm_layer, eps=norm_eps),
                            act_layer=act_layer, num_classes=num_classes)
        self._finish_init(self._frozen_parts(built, frozen_stages), grad_checkpointing)

    @classmethod
    def argument_names(cls) -> list[str]:
        """The constructor's arguments a user passes: the model's own, then the shared ones above."""
        names: list[str] = []
        for klass in cls.__mro__:
            if '__init__' not in vars(klass):
                continue
            params = inspect.signature(klass.__init__).parameters.values()
            names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                      and p.name not in ('self', *_TRUNK_ARGUMENTS) and p.name not in names]
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                break
        return names

    def _num_built_stages(self, num_stages: int) -> int:
        """How many of the trunk's stages this instance builds (all, unless a subclass cuts a dense backbone
        after its last output)."""
        return num_stages

    def _frozen_limit(self, built: Sequence[Stage]) -> tuple[int, str]:
        """The largest ``frozen_stages`` and what it counts."""
        raise NotImplementedError

    def _build_trunk(self, stages: Sequence[Stage], blocks: Sequence[Sequence[Callable[[], nn.Module]]], *,
                     norm_layer: Callable[..., nn.Module], drop_rate: float) -> None:
        """Mount the patch embeddings and blocks of the built ``stages``; ``blocks[i][j]()`` makes block j of
        stage i."""
        raise NotImplementedError

    def _build_outputs(self, stages: Sequence[Stage], strides: Sequence[int], unbuilt: list[str], *,
                       norm_layer: Callable[..., nn.Module], act_layer: Callable[..., nn.Module],
                       num_classes: int) -> None:
        """Set ``out_channels``, ``strides``, ``num_features``, ``feature_info`` and ``unbuilt_prefixes``
        (``unbuilt``: the position encodings' dropped prefixes) and mount the final norm and head or a dense
        backbone's layers; ``norm_layer(dim)`` is the final norm at ``norm_eps``."""
        raise NotImplementedError

    def _frozen_parts(self, stages: Sequence[Stage], frozen_stages: int) -> list:
        """The modules and parameters ``frozen_stages`` freezes."""
        raise NotImplementedError

    def _setup_outputs(self, features_only: bool, num_classes: int, out_indices: Sequence[int] | None,
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

    def _setup_position(self, geometry: Geometry, pos_encoding, built_depths: Sequence[int]) -> list[str]:
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
    def pos_encodings(self) -> list[PositionEncoding]:
        return [getattr(self, attr) for attr in self.pos_encoding_attrs]

    def _position_parts(self, stage: int, blocks: Iterable[int], embedding: bool = False) -> list:
        """The position-encoding parts tied to these blocks of ``stage`` (and its patch embedding): what
        freezing them also freezes."""
        blocks = list(blocks)
        return [part for enc in self.pos_encodings for part in enc.parts_of(stage, blocks, embedding)]

    def _cut_position(self, kept_depths: Sequence[int]) -> list[str]:
        """Drop the encodings' parts beyond the first ``kept_depths[i]`` blocks of each stage; returns the
        dropped key prefixes (``attr.``-qualified)."""
        return [f'{enc.attr}.{key}' for enc in self.pos_encodings for key in enc.cut(kept_depths)]

    def _embed_position(self, stage: int, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        for enc in self.pos_encodings:
            x = enc.embed(stage, x, hw)
        return x

    def _run_blocks(self, blocks: nn.ModuleList, stage: int, x: torch.Tensor, hw: tuple[int, int],
                    tap: Callable[[int, torch.Tensor], None] | None = None,
                    stop: int | None = None) -> torch.Tensor:
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

    def _cut_to(self, keep: int) -> list[str]:
        """Keep the first ``keep`` taps of ``feature_info`` (stages or blocks) and the PEGs after them; return
        the key prefixes of what was dropped (subclasses)."""
        raise NotImplementedError

    def prune_intermediate_layers(self, indices: None | int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
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

    def _init_weights(self) -> None:
        """The Twins/timm initialisation of every layer (``init_weights``)."""
        self.apply(init_weights)

    def _finish_init(self, frozen: list, grad_checkpointing: bool) -> None:
        self._init_weights()
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
        if is_fx_tracing():  # x is a torch.fx Proxy: there is no tensor to check, and the traced graph checks none
            return
        check_input(x, self.in_chans, self.check_finite)
        if symbolic_shapes():  # torch.compile/export/ONNX record the graph: the eager call checks the dtype
            return
        weight = next(self.parameters(), None)
        if weight is not None and x.dtype != weight.dtype and not autocast_enabled(x.device.type):
            raise TypeError(f'input is {x.dtype} but the model\'s weights are {weight.dtype}: convert one to the '
                            f'other (x.to({weight.dtype}) or model.to({x.dtype})), or run under torch.autocast')

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def _block(self, blk: nn.Module, x: torch.Tensor, hw: tuple[int, int], pos) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(blk, x, hw, pos, use_reentrant=False)
        return blk(x, hw, pos)

    def no_weight_decay(self) -> set[str]:
        """Names of parameters that the recipes exclude from weight decay: every position encoding's (PEG, as
        Twins; tables, biases and RoPE frequencies, as DeiT, Swin and RoPE-ViT) and the class token."""
        prefixes = tuple(f'{attr}.' for attr in self.pos_encoding_attrs)
        names = {n for n, _ in self.named_parameters() if n.startswith(prefixes)}
        return names | ({'cls_token'} if getattr(self, 'cls_token', None) is not None else set())
