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
from ..layers import Attention, Block, LocallyGroupedAttention, Mlp
from ..layers.layout import symbolic_shapes
from ..layers.position import Geometry, PositionEncoding, build_position_encodings, merge_attention
from ..layers.valid import Region, check_valid_sizes, region


def check_input(x, in_chans: int, check_finite: bool = False) -> None:
    """Raise a TypeError unless ``x`` is a floating-point tensor, a ValueError unless it is a non-empty
    (B, in_chans, H, W) one; with ``check_finite`` also a ValueError on NaN or Inf (a full pass over the input)."""
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
    if check_finite:
        refuse_nonfinite(x)


def refuse_nonfinite(x: torch.Tensor, valid_sizes: torch.Tensor | None = None) -> None:
    """Raise a ValueError where the (B, C, H, W) input ``x`` holds NaN or Inf; with ``valid_sizes``
    (``layers.valid.check_valid_sizes``'s (B, 2) tensor) only within each image's valid region."""
    bad = region(valid_sizes, 1, x.shape[-2:]).fill_map(~torch.isfinite(x), False)
    if bad.any():
        where = " within the images' valid sizes" if valid_sizes is not None else ''
        raise ValueError(f'input of shape {tuple(x.shape)} contains {bad.sum().item()} NaN or Inf values{where}; '
                         'expected finite floats (check_finite=True)')


def check_out_indices(out_indices: int | Sequence[int], num_outputs: int) -> tuple[int, ...]:
    """``out_indices`` as a tuple (an int is one level); a ValueError unless its ints are increasing, distinct
    and within ``0..num_outputs - 1``."""
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
    """timm's ``indices`` convention over ``num`` levels: None = all, an int n = the last n, a sequence = those
    (negative ones count from the end). Returns the absolute indices and the largest; a ValueError where one
    is out of range."""
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
    """Initialise ``m`` in place as Twins and timm do (``nn.Linear``, ``nn.LayerNorm``, ``nn.Conv2d``; other
    modules untouched); for ``nn.Module.apply``."""
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
    """One stage of a model's trunk, all a build loop reads:

    * the patch embedding: stride ``patch_size`` over the previous map (the image for the first stage), kernel
      ``embed_kernel`` (None: ``patch_size``, non-overlapping; an odd larger kernel overlaps);
    * ``depth`` blocks of width ``dim`` with ``num_heads`` heads;
    * their attention: keys/values reduced ``sr_ratio`` times per side by ``reduction`` ('pad', 'drop' or 'pool';
      ``layers.Attention``); with a ``window_size`` the even blocks attend within windows of that many tokens per
      side instead, padded tokens masked out with ``window_mask`` (``layers.LocallyGroupedAttention``);
    * their MLP: hidden width ``dim * mlp_ratio``, built by ``mlp_layer`` (None: the model's; a class that sets
      ``takes_grid`` is also given the token grid);
    * ``norm``: a norm after the stage's last block, on what the next stage and the outputs see.
    """
    dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    patch_size: int
    sr_ratio: int = 1
    window_size: int | None = None
    window_mask: bool = False
    embed_kernel: int | None = None
    reduction: str = 'pad'
    mlp_layer: Callable[..., nn.Module] | None = None
    norm: bool = False


def per_stage(**settings: Sequence) -> list[tuple]:
    """The family constructors' per-stage settings as one tuple per stage (in the order given), or a ValueError
    naming each setting's length where they differ."""
    lengths = {name: len(values) for name, values in settings.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f'per-stage settings must all have one entry per stage, got lengths {lengths}')
    return list(zip(*settings.values()))


def stage_strides(stages: Sequence[Stage]) -> tuple[int, ...]:
    """Each stage's token stride in input pixels."""
    return tuple(math.prod(s.patch_size for s in stages[:i + 1]) for i in range(len(stages)))


@dataclass(frozen=True)
class Parts:
    """``CPVTBase``'s shared arguments of these names, which a family's build hooks make modules from; a
    ValueError unless the three rates are in [0, 1). Kept by no model."""
    qkv_bias: bool
    drop_rate: float
    attn_drop_rate: float
    drop_path_rate: float
    norm_eps: float
    layer_scale_init: float | None
    attn_layer: Callable[..., nn.Module]
    mlp_layer: Callable[..., nn.Module]
    norm_layer: Callable[..., nn.Module]
    act_layer: Callable[..., nn.Module]

    def __post_init__(self):
        for name in ('drop_rate', 'attn_drop_rate', 'drop_path_rate'):
            rate = getattr(self, name)
            if not 0 <= rate < 1:
                raise ValueError(f'{name} must be in [0, 1) (the probability of dropping), got {rate!r}')

    def norm(self, dim: int) -> nn.Module:
        """A new token norm of width ``dim`` with ``norm_eps``."""
        return self.norm_layer(dim, eps=self.norm_eps)

    def drop_paths(self, stages: Sequence[Stage]) -> list[list[float]]:
        """Per stage, each block's stochastic-depth rate: linear from 0 to ``drop_path_rate`` over all blocks
        of ``stages`` (the whole trunk, built or not)."""
        rates = torch.linspace(0, self.drop_path_rate, sum(s.depth for s in stages), device='cpu').tolist()
        starts = [sum(s.depth for s in stages[:i]) for i in range(len(stages))]
        return [rates[start:start + s.depth] for s, start in zip(stages, starts)]

    def block(self, stage: Stage, index: int, drop_path: float) -> Block:
        """A new block ``index`` of ``stage``: on a stage with windows the even blocks attend within them
        (``layers.LocallyGroupedAttention``), every other block with ``attn_layer`` over keys and values reduced
        by the stage's ``reduction``."""
        if stage.window_size is not None and index % 2 == 0:
            attn_layer = partial(LocallyGroupedAttention, window_size=stage.window_size, window_mask=stage.window_mask)
            sr_ratio = 1
        else:
            attn_layer = self.attn_layer if stage.reduction == 'pad' else \
                partial(self.attn_layer, reduction=stage.reduction)
            sr_ratio = stage.sr_ratio
        return Block(stage.dim, stage.num_heads, stage.mlp_ratio, qkv_bias=self.qkv_bias, drop=self.drop_rate,
                     attn_drop=self.attn_drop_rate, drop_path=drop_path, sr_ratio=sr_ratio, norm_eps=self.norm_eps,
                     layer_scale_init=self.layer_scale_init, attn_layer=attn_layer,
                     mlp_layer=stage.mlp_layer or self.mlp_layer, norm_layer=self.norm_layer, act_layer=self.act_layer)


class CPVTBase(nn.Module):
    """What every family shares: the shared constructor arguments and build order (``__init__``), input checks,
    running the blocks with their position encodings, checkpointing, the classifier methods and timm's pruning.
    A family passes its ``stages`` and implements ``_build_trunk``, ``_build_outputs`` and ``_frozen_parts`` (and
    may extend ``_init_weights``), which ``__init__`` calls in that order.

    Attributes, with the same meaning in every family:

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
                 pos_encoding: Any = 'peg', frozen_stages: int = -1, in_chans: int = 3, num_classes: int = 1000,
                 qkv_bias: bool = True, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0., norm_eps: float = 1e-6, layer_scale_init: float | None = None,
                 attn_layer: Callable[..., nn.Module] = Attention, mlp_layer: Callable[..., nn.Module] = Mlp,
                 norm_layer: Callable[..., nn.Module] = nn.LayerNorm, act_layer: Callable[..., nn.Module] = nn.GELU,
                 features_only: bool = False, out_indices: Sequence[int] | None = None,
                 grad_checkpointing: bool = False, check_finite: bool = False):
        """Build the trunk, position encodings, outputs and head, initialise, freeze. The family passes
        ``stages`` (the whole trunk), ``num_levels`` (maps a dense backbone can return) and ``num_prefix_tokens``,
        and documents ``pos_encoding`` and ``frozen_stages``. Raises a ValueError on any argument out of range.
        Args:
            in_chans: channels of the input image.
            num_classes: classes of the linear head; 0 builds no head (``forward`` returns the pooled features). Must be
                0 with ``features_only``.
            qkv_bias: bias on the query, key and value projections.
            drop_rate: dropout after the position encoding, in the attention's output projection and in the MLP.
            attn_drop_rate: dropout on the attention weights.
            drop_path_rate: stochastic depth of the last block; it rises linearly from 0 at the first block over all
                blocks of all stages (built or not). This and the two dropout rates must be in [0, 1).
            norm_eps: eps of the blocks' two norms, the stages' and the final norm; the patch embedding's and the
                attention's reduction norm keep ``norm_layer``'s default (1e-5 for ``nn.LayerNorm``).
            layer_scale_init: CaiT's layer scale on both residual branches of every block, initialised to this value;
                None for none.
            attn_layer: the blocks' attention, called ``attn_layer(dim, num_heads, qkv_bias=, attn_drop=, proj_drop=,
                sr_ratio=, norm_layer=)`` (and ``reduction=`` where a stage reduces otherwise than by padding;
                ``layers.Attention``); windowed blocks use ``layers.LocallyGroupedAttention``.
            mlp_layer: the blocks' MLP where a stage names none, called ``mlp_layer(dim, hidden_dim, act_layer=,
                drop=)`` (``layers.Mlp``).
            norm_layer: every token norm, called ``norm_layer(dim, eps=)`` or ``norm_layer(dim)``: the blocks' two, the
                stages' and the final norm, the patch embeddings' and the attention's reduction norm.
            act_layer: the activation of every MLP (``act_layer()``) and of the simple feature pyramid.
            features_only: build a dense backbone returning NCHW feature maps (``out_indices``) instead of a classifier:
                no head, and nothing the last returned map does not need.
            out_indices: with ``features_only``, the levels ``forward`` returns (increasing; an int is one level;
                default all).
            grad_checkpointing: recompute each block's activations in the backward pass (less memory, more time).
            check_finite: make ``forward`` raise a ValueError on NaN or Inf inputs (a pass over the input; with
                ``valid_sizes`` over each image's valid region only).
        """
        super().__init__()
        parts = Parts(qkv_bias=qkv_bias, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                      drop_path_rate=drop_path_rate, norm_eps=norm_eps, layer_scale_init=layer_scale_init,
                      attn_layer=attn_layer, mlp_layer=mlp_layer, norm_layer=norm_layer, act_layer=act_layer)
        self.in_chans = in_chans
        self.check_finite = check_finite
        self.grad_checkpointing = grad_checkpointing
        self.num_prefix_tokens = num_prefix_tokens
        self.stage_specs = tuple(stages)
        self._setup_outputs(features_only, num_classes, out_indices, num_levels)
        self._frozen: list = []
        built_depths, dropped = self._build_trunk(parts)
        unbuilt = self._mount_position_encodings(pos_encoding, built_depths)
        dropped += unbuilt + self._build_outputs(parts) + (['head.'] if features_only else [])
        self.unbuilt_prefixes = tuple(dropped)
        if not features_only:
            self.reset_classifier(num_classes)
        self._init_weights()
        self.freeze(self._frozen_parts(frozen_stages))

    @classmethod
    def argument_names(cls) -> list[str]:
        """The constructor's arguments a user passes: the class's own, then its parents' down to these."""
        names: list[str] = []
        for klass in cls.__mro__:
            if '__init__' not in vars(klass):
                continue
            params = inspect.signature(klass.__init__).parameters.values()
            names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                      and p.name not in ('self', 'num_levels', 'stages', 'num_prefix_tokens') and p.name not in names]
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                break
        return names

    def _build_trunk(self, parts: Parts) -> tuple[list[int], list[str]]:
        """Build the patch embeddings and blocks of ``stage_specs`` (those a dense backbone needs) from
        ``parts``; return how many blocks of each stage were built and the key prefixes of what was not."""
        raise NotImplementedError

    def _build_outputs(self, parts: Parts) -> list[str]:
        """Build the final norm and what a dense backbone returns, and set ``out_channels``, ``strides``,
        ``num_features`` and ``feature_info``; return the key prefixes of the classification layout not built."""
        raise NotImplementedError

    def _frozen_parts(self, frozen_stages: int) -> list:
        """The modules and parameters ``frozen_stages`` freezes (a ValueError where it is out of range)."""
        raise NotImplementedError

    def _init_weights(self) -> None:
        """The Twins/timm initialisation of every module (``init_weights``)."""
        self.apply(init_weights)

    @staticmethod
    def check_frozen_stages(frozen_stages: int, limit: int, unit: str) -> None:
        if not -1 <= frozen_stages <= limit:
            raise ValueError(f'frozen_stages must be within -1..{limit} ({unit}), got {frozen_stages}')

    def _mount_position_encodings(self, pos_encoding, built_depths: Sequence[int]) -> list[str]:
        """Build the encodings ``pos_encoding`` names for the whole trunk ``stage_specs``, mount each under its
        ``attr``, and keep only the parts of the first ``built_depths[i]`` blocks of every stage; returns the
        dropped key prefixes. A ValueError where an ``attr`` is taken or a logit bias meets windows or a
        reduction other than 'pad'."""
        stages = self.stage_specs
        geometry = Geometry(dims=tuple(s.dim for s in stages), depths=tuple(s.depth for s in stages),
                            heads=tuple(s.num_heads for s in stages), strides=stage_strides(stages),
                            sr_ratios=tuple(s.sr_ratio for s in stages), num_prefix_tokens=self.num_prefix_tokens,
                            reductions=tuple(s.reduction for s in stages))
        encodings = build_position_encodings(pos_encoding, geometry)
        for enc in encodings:
            if hasattr(self, enc.attr):
                raise ValueError(f'position encoding {enc.name!r} would replace the model\'s {enc.attr!r}')
            setattr(self, enc.attr, enc)
        self.pos_encoding_attrs = tuple(enc.attr for enc in encodings)
        biased = [enc.name for enc in encodings if enc.biases_logits]
        if biased and any(s.window_size is not None or s.reduction != 'pad' for s in stages):
            raise ValueError(f'position encoding {biased[0]!r} biases global attention logits over keys reduced with '
                             'padding; windowed blocks (window_sizes) and other reductions cannot take it')
        return self._cut_position(built_depths) if tuple(built_depths) != geometry.depths else []

    def freeze(self, parts: list) -> None:
        """``requires_grad=False`` on these modules and parameters; the modules stay in eval mode while the
        model trains (``train``)."""
        self._frozen = parts
        for item in parts:
            params = [item] if isinstance(item, nn.Parameter) else item.parameters()
            for p in params:
                p.requires_grad_(False)

    def _setup_outputs(self, features_only: bool, num_classes: int, out_indices: Sequence[int] | None,
                       num_levels: int) -> None:
        """Set ``out_indices`` (``()`` for a classifier; default all ``num_levels`` for a dense backbone),
        ``features_only`` and ``num_classes``; a ValueError where they contradict."""
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

    def _embed_position(self, stage: int, x: torch.Tensor, hw: tuple[int, int], region: Region) -> torch.Tensor:
        for enc in self.pos_encodings:
            x = enc.embed(stage, x, hw, region)
        return x

    def _run_blocks(self, blocks: nn.ModuleList, stage: int, x: torch.Tensor, hw: tuple[int, int],
                    region: Region, tap: Callable[[int, torch.Tensor], None] | None = None,
                    stop: int | None = None) -> torch.Tensor:
        """Blocks 0..``stop`` (all by default), each given its attention's position input and followed by the
        encodings' ``after_block`` (a PEG); ``tap(j, x)`` sees the tokens after block j and its PEG. ``region``:
        the stage's (``layers.valid``); the tokens beyond each image come out as the last layer left them."""
        encodings = self.pos_encodings
        per_block = [enc.attention(stage, hw) for enc in encodings]
        names = [enc.name for enc in encodings]
        for j, blk in enumerate(blocks):
            if stop is not None and j > stop:
                break
            pos = merge_attention([p[j] if p is not None else None for p in per_block], names)
            x = self._block(blk, x, hw, pos, region)
            for enc in encodings:
                x = enc.after_block(stage, j, x, hw, region)
            if tap is not None:
                tap(j, x)
        return x

    def _cut_to(self, keep: int) -> list[str]:
        """Keep the first ``keep`` taps of ``feature_info`` (stages or blocks) and the PEGs after them; return
        the key prefixes of what was dropped (subclasses)."""
        raise NotImplementedError

    def prune_intermediate_layers(self, indices: None | int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's pruning, in place: keep the taps up to the last one ``indices`` picks (``take_indices``); drop
        the head and the final norm where asked or where the cut left them sized for features that are gone.
        Returns the absolute indices; a ValueError on a ``features_only`` model."""
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
        """Replace the head with a fresh ``nn.Linear`` for ``num_classes`` (torch's default init; 0: none,
        ``forward`` returns the pooled features). A ValueError on a ``features_only`` model."""
        if self.features_only:
            raise ValueError('a features_only model has no classifier')
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()
        rest = tuple(p for p in self.unbuilt_prefixes if p != 'head.')
        self.unbuilt_prefixes = rest if num_classes else rest + ('head.',)

    def train(self, mode: bool = True):
        """Frozen parts stay in eval mode (no dropout / stochastic depth) even while the rest trains."""
        super().train(mode)
        for item in self._frozen:
            if isinstance(item, nn.Module):
                item.eval()
        return self

    def _check_input(self, x, valid_sizes=None) -> torch.Tensor | None:
        """Refuse a bad input (``check_input``; a TypeError for a dtype the weights do not take, outside
        autocast); returns ``valid_sizes`` checked against ``x`` (``layers.valid.check_valid_sizes``), or None
        without. Under torch.fx tracing checks nothing and returns None: the traced graph ignores ``valid_sizes``."""
        if is_fx_tracing():  # x is a torch.fx Proxy: there is no tensor to check, and the traced graph checks none
            return None
        check_input(x, self.in_chans)
        sizes = None if valid_sizes is None else check_valid_sizes(valid_sizes, x)
        if self.check_finite:
            refuse_nonfinite(x, sizes)
        if symbolic_shapes():  # torch.compile/export/ONNX record the graph: the eager call checks the dtype
            return sizes
        weight = next(self.parameters(), None)
        if weight is not None and x.dtype != weight.dtype and not autocast_enabled(x.device.type):
            raise TypeError(f'input is {x.dtype} but the model\'s weights are {weight.dtype}: convert one to the '
                            f'other (x.to({weight.dtype}) or model.to({x.dtype})), or run under torch.autocast')
        return sizes

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def _block(self, blk: nn.Module, x: torch.Tensor, hw: tuple[int, int], pos, region: Region) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(blk, x, hw, pos, region, use_reentrant=False)
        return blk(x, hw, pos, region)

    @staticmethod
    def _pooled(x: torch.Tensor, valid_sizes, stride: int, prefix: int = 0) -> torch.Tensor:
        """The average of each image's own tokens of ``forward_features``' (B, prefix + N, C) ``x`` past the
        prefix (``valid_sizes``: as given to ``forward_features``, or None)."""
        sizes = None if valid_sizes is None else torch.as_tensor(valid_sizes, device=x.device)
        return region(sizes, stride, (0, 0), prefix).mean(x)

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the recipes exclude from weight decay: every position encoding's and
        ``cls_token`` (where built)."""
        prefixes = tuple(f'{attr}.' for attr in self.pos_encoding_attrs)
        names = {n for n, _ in self.named_parameters() if n.startswith(prefixes)}
        return names | ({'cls_token'} if getattr(self, 'cls_token', None) is not None else set())
