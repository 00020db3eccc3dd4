"""Key-layout converters between the native layout and other frameworks': each returns a new dict (its tensors
may share storage with the input's) and leaves its input as it is.

The native layout is our models' keys, which are those of the official Twins/CPVT releases and of timm's
``twins_pcpvt_*`` and ``twins_svt_*``. Every other layout is a table of rules, ``(native template, foreign
template)`` pairs read in one direction and written in the other by ``apply_rules``. Each converter maps every
key it is given or raises ``UnknownKeysError`` naming the keys it cannot place; the only keys dropped are those
a rule names (the classifier's ``norm`` and ``head`` when writing mmseg's backbone).
"""
import re
from collections.abc import Callable, Mapping, Sequence
from re import Pattern
from typing import NamedTuple

import torch

from ..layers.position import state_dict_roots

StateDict = dict[str, torch.Tensor]

# Roots of the native keys that belong to the model itself rather than to a position encoding (whose roots come
# from the encoding registry, ``native_roots``): the patch embeddings (pyramid, columnar), the class token, the
# blocks, the stages' norms (PVTv2) and the final norm, the simple feature pyramid of a dense columnar model, the
# classifier head.
MODEL_ROOTS = ('patch_embeds.', 'patch_embed.', 'cls_token', 'blocks.', 'norms.', 'norm.', 'simple_fpn.', 'head.')


def native_roots() -> tuple[str, ...]:
    """The prefixes of every native key: the model's own roots and those of every registered position encoding
    (``cpvt_backbones.layers.position.state_dict_roots``)."""
    return MODEL_ROOTS + state_dict_roots()


class UnknownLayoutError(ValueError):
    """A state dict in none of the layouts ``detect_layout`` knows: the message lists them and the first keys, and
    where keys lie under ``backbone.`` (a whole detector's or segmentor's weights) how to take the backbone."""


class UnknownKeysError(KeyError):
    def __init__(self, layout: str, keys: Sequence[str]):
        keys = sorted(keys)
        shown = ', '.join(keys[:20]) + (f', ... ({len(keys) - 20} more)' if len(keys) > 20 else '')
        super().__init__(f'{len(keys)} key(s) are not part of the {layout} layout: {shown}')

    def __str__(self) -> str:
        return self.args[0]


class Fold(NamedTuple):
    """How one tensor of a layout is several of another: ``split`` takes the tensor to its parts by name,
    ``merge`` takes the parts back to the tensor (None when parts are missing: their keys are then unknown)."""
    split: Callable[[torch.Tensor], dict[str, torch.Tensor]]
    merge: Callable[[dict[str, torch.Tensor]], torch.Tensor | None]


def split_qkv(value: torch.Tensor) -> dict[str, torch.Tensor]:
    """A fused attention input projection (q; k; v stacked on dim 0) -> its ``q`` and ``kv`` (views)."""
    dim = value.shape[0] // 3
    return {'q': value[:dim], 'kv': value[dim:]}


def merge_qkv(parts: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """``q`` and ``kv`` -> the fused (q; k; v) projection; None unless both are given."""
    if set(parts) != {'q', 'kv'}:
        return None
    return torch.cat((parts['q'], parts['kv']), dim=0)


def _split_blocks(value: torch.Tensor) -> dict[str, torch.Tensor]:
    """timm's RoPE ``freqs`` (2, depth, heads, head_dim / 2) -> one (2, heads, head_dim / 2) copy per block."""
    return {str(j): value[:, j].clone() for j in range(value.shape[1])}


def _stack_blocks(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """One RoPE frequency tensor per block -> timm's (2, depth, heads, head_dim / 2); the blocks must be 0..n-1."""
    freqs = {int(j): value for j, value in parts.items()}
    if sorted(freqs) != list(range(len(freqs))):
        raise ValueError(f'rope.freqs.{{j}} must cover blocks 0..{len(freqs) - 1}, got {sorted(freqs)}')
    return torch.stack([freqs[j] for j in range(len(freqs))], dim=1)


QKV = Fold(split_qkv, merge_qkv)
PER_BLOCK = Fold(_split_blocks, _stack_blocks)


class Reshape(NamedTuple):
    """How one tensor of a layout is another's of another shape (a linear layer's weight as a 1 x 1
    convolution's): ``read`` takes the source's value to the target's, ``write`` back."""
    read: Callable[[torch.Tensor], torch.Tensor]
    write: Callable[[torch.Tensor], torch.Tensor]


LINEAR_AS_CONV1X1 = Reshape(lambda w: w[:, :, None, None], lambda w: w.flatten(1))

# A rule is (source template, target template), (source, target, fold) or (source, target, reshape); a target
# None drops the key. Fields:
# {i} {j} indices, {p} weight|bias, {n} a layer scale's 1|2, {part} q|kv, {rest} anything, {native} a native
# backbone key (under a root of ``native_roots`` other than the head). A fold rule's templates differ by one
# field: the source has it (its parts merge into one target key) or the target has it (the source splits).
Rule = tuple[str, str | None] | tuple[str, str, Fold]
_FIELDS = {'i': r'\d+', 'j': r'\d+', 'p': r'weight|bias', 'n': r'[12]', 'part': r'q|kv', 'rest': r'.*'}
_FIELD = re.compile(r'\{(\w+)\}')


class _Compiled(NamedTuple):
    source: Pattern
    target: str | None
    fold: Fold | None
    field: str | None     # the fold's field: in the source (a merge) or in the target (a split)
    reshape: Reshape | None = None


def _compile(rule: Rule, fields: Mapping[str, str]) -> _Compiled:
    source, target, *folds = rule
    pattern, end = '', 0
    for m in _FIELD.finditer(source):
        pattern += re.escape(source[end:m.start()]) + f'(?P<{m.group(1)}>{fields[m.group(1)]})'
        end = m.end()
    pattern = re.compile(pattern + re.escape(source[end:]))
    if not folds or isinstance(folds[0], Reshape):
        return _Compiled(pattern, target, None, None, folds[0] if folds else None)
    differ = set(_FIELD.findall(source)) ^ set(_FIELD.findall(target))
    if len(differ) != 1:
        raise ValueError(f'fold rule {rule[:2]} must differ by one field, got {sorted(differ)}')
    return _Compiled(pattern, target, folds[0], differ.pop())


def _first_match(compiled: Sequence[_Compiled], key: str) -> tuple[int, re.Match | None]:
    for index, rule in enumerate(compiled):
        m = rule.source.fullmatch(key)
        if m:
            return index, m
    return -1, None


def inverted(rules: Sequence[Rule]) -> list[Rule]:
    """The rules read the other way: targets become sources (a fold splits what it merged, and back; a reshape
    writes what it read)."""
    return [(target, source, *(Reshape(f.write, f.read) if isinstance(f, Reshape) else f for f in fold))
            for source, target, *fold in rules]


def apply_rules(state_dict: Mapping[str, torch.Tensor], rules: Sequence[Rule], layout: str) -> StateDict:
    """Rename every key by the first rule whose source template matches it whole.

    Renamed and split keys keep the input's order; merged keys follow them, by rule and then in the order their
    first part came. Keys that no rule matches, and the parts of a merge left incomplete, raise
    ``UnknownKeysError`` (``layout`` names the input's layout in its message).
    """
    native = '|'.join(re.escape(root) for root in native_roots() if root != 'head.')
    fields = {**_FIELDS, 'native': f'(?:{native}).*'}
    compiled = [_compile(rule, fields) for rule in rules]
    out: StateDict = {}
    unknown: list[str] = []
    merges: dict[tuple[int, str], dict[str, tuple[str, torch.Tensor]]] = {}
    for key, value in state_dict.items():
        index, m = _first_match(compiled, key)
        if m is None:
            unknown.append(key)
            continue
        rule, names = compiled[index], m.groupdict()
        if rule.target is None:
            continue
        if rule.fold is None:
            out[rule.target.format(**names)] = value if rule.reshape is None else rule.reshape.read(value)
        elif rule.field in names:
            part = names.pop(rule.field)
            merges.setdefault((index, rule.target.format(**names)), {})[part] = (key, value)
        else:
            for part, piece in rule.fold.split(value).items():
                out[rule.target.format(**names, **{rule.field: part})] = piece
    for (index, target), parts in sorted(merges.items(), key=lambda item: item[0][0]):
        merged = compiled[index].fold.merge({part: value for part, (_, value) in parts.items()})
        if merged is None:
            unknown += [key for key, _ in parts.values()]
        else:
            out[target] = merged
    if unknown:
        raise UnknownKeysError(layout, unknown)
    return out


# (native, mmseg) for mmseg 1.x ``PCPVT`` and ``SVT``. A global attention's q and kv are one nn.MultiheadAttention
# there (``in_proj``, ``out_proj``); a windowed one (SVT's, with a fused ``qkv``) keeps our names, ``proj`` included,
# which ``native_to_mmseg`` adds per windowed block.
_MMSEG = [
    ('patch_embeds.{i}.proj.{p}', 'patch_embeds.{i}.projection.{p}'),
    ('patch_embeds.{i}.norm.{p}', 'patch_embeds.{i}.norm.{p}'),
    ('pos_block.{i}.proj.0.{p}', 'position_encodings.{i}.proj.{p}'),
    ('blocks.{i}.{j}.norm1.{p}', 'layers.{i}.{j}.norm1.{p}'),
    ('blocks.{i}.{j}.norm2.{p}', 'layers.{i}.{j}.norm2.{p}'),
    ('blocks.{i}.{j}.attn.qkv.{p}', 'layers.{i}.{j}.attn.qkv.{p}'),
    ('blocks.{i}.{j}.attn.{part}.{p}', 'layers.{i}.{j}.attn.attn.in_proj_{p}', QKV),
    ('blocks.{i}.{j}.attn.proj.{p}', 'layers.{i}.{j}.attn.attn.out_proj.{p}'),
    ('blocks.{i}.{j}.attn.sr.{p}', 'layers.{i}.{j}.attn.sr.{p}'),
    ('blocks.{i}.{j}.attn.norm.{p}', 'layers.{i}.{j}.attn.norm.{p}'),
    ('blocks.{i}.{j}.mlp.fc1.{p}', 'layers.{i}.{j}.ffn.layers.0.0.{p}'),
    ('blocks.{i}.{j}.mlp.fc2.{p}', 'layers.{i}.{j}.ffn.layers.1.{p}'),
]
# The classifier's final norm and head, which mmseg's backbone has no place for: left out when writing.
_CLASSIFIER_ONLY = [('norm.{rest}', None), ('head.{rest}', None)]


_WINDOWED = re.compile(r'blocks\.(\d+)\.(\d+)\.attn\.qkv\.(?:weight|bias)')
_GLOBAL = re.compile(r'blocks\.(\d+)\.(\d+)\.attn\.(?:q|kv)\.(?:weight|bias)')


def windowed_blocks(state_dict: Mapping[str, torch.Tensor]) -> list[tuple[str, str]]:
    """(stage, block) of the native blocks whose attention is windowed (a fused ``attn.qkv``: SVT's even blocks).
    A block with both ``qkv`` and ``q``/``kv`` is neither kind: its ``qkv`` keys raise ``UnknownKeysError``."""
    windowed = {m.groups() for m in map(_WINDOWED.fullmatch, state_dict) if m}
    mixed = {m.groups() for m in map(_GLOBAL.fullmatch, state_dict) if m} & windowed
    if mixed:
        raise UnknownKeysError('native (a block has either a windowed qkv or a global q and kv)',
                               [k for k in state_dict if (m := _WINDOWED.fullmatch(k)) and m.groups() in mixed])
    return sorted(windowed, key=lambda ij: (int(ij[0]), int(ij[1])))


def mmseg_to_native(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """mmseg 1.x ``PCPVT`` or ``SVT`` backbone keys -> native. ``in_proj`` (q; k; v stacked) splits into ``q``
    and ``kv``, ``out_proj`` is ``proj``; a windowed block's ``qkv`` and ``proj`` keep their names; a final
    ``norm`` is kept. mmseg's optional ``norm_list`` (``norm_after_stage=True``) raises ``UnknownKeysError``."""
    # The final norm: mmseg's converter (twins2mmseg.py, which made its published weights) keeps it, and both
    # dense backbones ignore it on load.
    rules = inverted(_MMSEG) + [('layers.{i}.{j}.attn.proj.{p}', 'blocks.{i}.{j}.attn.proj.{p}'),
                                ('norm.{p}', 'norm.{p}')]
    return apply_rules(state_dict, rules, 'mmseg PCPVT/SVT')


def native_to_mmseg(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Native -> mmseg 1.x ``PCPVT`` or ``SVT`` backbone keys (``windowed_blocks`` keep ``attn.proj``). The
    classifier's final ``norm`` and ``head`` are left out; any other key that does not fit raises
    ``UnknownKeysError``."""
    windowed = [(f'blocks.{i}.{j}.attn.proj.{{p}}', f'layers.{i}.{j}.attn.proj.{{p}}')
                for i, j in windowed_blocks(state_dict)]
    return apply_rules(state_dict, windowed + _CLASSIFIER_ONLY + _MMSEG, 'our (Twins/timm) PCPVT/SVT')


# (native, mmpretrain) for mmpretrain 1.x ``PCPVT`` or ``SVT`` inside an ``ImageClassifier`` (GAP neck,
# LinearClsHead): the blocks keep our names (a windowed block's fused ``qkv`` included).
_MMPRETRAIN = [
    ('patch_embeds.{i}.proj.{p}', 'backbone.patch_embeds.{i}.projection.{p}'),
    ('patch_embeds.{i}.norm.{p}', 'backbone.patch_embeds.{i}.norm.{p}'),
    ('pos_block.{i}.proj.0.{p}', 'backbone.position_encodings.{i}.proj.{p}'),
    ('blocks.{i}.{j}.mlp.fc1.{p}', 'backbone.stages.{i}.{j}.ffn.layers.0.0.{p}'),
    ('blocks.{i}.{j}.mlp.fc2.{p}', 'backbone.stages.{i}.{j}.ffn.layers.1.{p}'),
] + [(f'blocks.{{i}}.{{j}}.{m}.{{p}}', f'backbone.stages.{{i}}.{{j}}.{m}.{{p}}')
     for m in ('norm1', 'norm2', 'attn.q', 'attn.kv', 'attn.qkv', 'attn.sr', 'attn.norm', 'attn.proj')] + [
    ('norm.{p}', 'backbone.norm_after_stage3.{p}'),
    ('head.{p}', 'head.fc.{p}'),
]


def mmpretrain_to_native(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """mmpretrain 1.x ``PCPVT`` or ``SVT`` keys -> native: a whole classifier (``backbone.*``, ``head.fc.*``) or
    its backbone alone (keys without the ``backbone.`` prefix)."""
    if not any(k.startswith(('backbone.', 'head.fc.')) for k in state_dict):
        state_dict = {f'backbone.{k}': v for k, v in state_dict.items()}
    return apply_rules(state_dict, inverted(_MMPRETRAIN), 'mmpretrain PCPVT/SVT')


def native_to_mmpretrain(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Native -> an mmpretrain 1.x ``ImageClassifier`` with its ``PCPVT`` or ``SVT`` backbone
    (``norm_after_stage`` on the last stage only, as in mmpretrain's Twins configs) and a ``LinearClsHead``."""
    windowed_blocks(state_dict)  # a block of both attention kinds raises
    return apply_rules(state_dict, _MMPRETRAIN, 'our (Twins/timm) PCPVT/SVT')


# (native, timm) for what timm's ViTs (DeiT, the RoPE ViTs) share with our columnar model; q and kv are one qkv.
_VIT = [(key, key) for key in ('cls_token', 'patch_embed.proj.{p}', 'norm.{p}', 'head.{p}')] + [
    (f'blocks.{{i}}.{m}.{{p}}',) * 2 for m in ('norm1', 'norm2', 'attn.proj', 'mlp.fc1', 'mlp.fc2')] + [
    ('blocks.{i}.attn.{part}.{p}', 'blocks.{i}.attn.qkv.{p}', QKV)]
_DEIT = _VIT + [('pos_block.{i}.proj.0.{p}', 'pos_block.{i}.proj.0.{p}')]
# timm's RoPE ViTs: layer scales ``gamma_1/2``, and ``rope.freqs`` (2, depth, heads, head_dim / 2) for all blocks.
_ROPE_VIT = _VIT + [('blocks.{i}.ls{n}.gamma', 'blocks.{i}.gamma_{n}'), ('rope.freqs.{j}', 'rope.freqs', PER_BLOCK)]
_QKV = re.compile(r'blocks\.\d+\.attn\.qkv\.(weight|bias)')
_ROPE_VIT_ONLY = re.compile(r'rope\.freqs|blocks\.\d+\.gamma_[12]')


def deit_to_native(state_dict: Mapping[str, torch.Tensor], drop_pos_embed: bool = False) -> StateDict:
    """DeiT / timm ViT keys (fused ``attn.qkv``) -> our columnar CPVT (``attn.q`` + ``attn.kv``).

    DeiT's ``pos_embed`` becomes ``pos_embed.0`` (a CPVT built with ``pos_encoding=dict(type='learned',
    img_size=224)`` takes it) unless ``drop_pos_embed=True`` (the PEGs then start fresh: load with
    ``strict=False``). Distillation tokens and heads raise ``UnknownKeysError``.
    """
    pos_embed = ('pos_embed', None if drop_pos_embed else 'pos_embed.0')
    return apply_rules(state_dict, inverted(_DEIT) + [pos_embed], 'DeiT/timm ViT')


def rope_vit_to_native(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """timm's RoPE ViTs (Heo et al.; ``timm.models.eva``'s ``vit_*_patch16_rope_224`` and
    ``..._rope_mixed_224``) -> our columnar model built as they are: ``pos_encoding='rope_axial'`` or
    ``'rope_mixed'``, ``layer_scale_init`` set (``tests/test_position.py`` has the settings).

    ``attn.qkv`` splits into ``attn.q`` / ``attn.kv``, ``gamma_1/2`` are the layer scales
    ``ls1/ls2.gamma``, and ``rope.freqs`` (2, depth, heads, head_dim / 2) splits into one ``rope.freqs.{j}``
    per block. Anything else raises ``UnknownKeysError``."""
    return apply_rules(state_dict, inverted(_ROPE_VIT), 'timm RoPE ViT')


def native_to_rope_vit(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Native (a columnar model with RoPE, see ``rope_vit_to_native``) -> timm's RoPE ViT keys; keys of other
    position encodings (a PEG) have no place there and raise ``UnknownKeysError``."""
    return apply_rules(state_dict, _ROPE_VIT, 'our columnar model with RoPE')


# (native, our backbone inside an mmpretrain ``ImageClassifier``): the keys of a checkpoint of configs/imagenet.
_CLASSIFIER = [('head.{rest}', 'head.fc.{rest}'), ('{native}', 'backbone.{native}')]


def backbone_only(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """The native layout without the classifier head: the checkpoint a dense config's ``init_cfg`` points at."""
    sd = to_native(state_dict)
    return {k: v for k, v in sd.items() if not k.startswith('head.')}


def classifier_to_native(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Our backbone inside an mmpretrain ``ImageClassifier`` (``backbone.*`` native, ``head.fc.*``), e.g. a
    checkpoint of ``configs/imagenet`` -> native."""
    return apply_rules(state_dict, inverted(_CLASSIFIER), 'mmpretrain ImageClassifier with our backbone')


def native_to_classifier(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Native -> our backbone inside an mmpretrain ``ImageClassifier`` (``backbone.*``, ``head.fc.*``): the keys
    of a checkpoint of ``configs/imagenet`` (the inverse of ``classifier_to_native``)."""
    return apply_rules(state_dict, _CLASSIFIER, 'our (Twins/timm)')


def _is_our_classifier(keys: Sequence[str], roots: tuple[str, ...]) -> bool:
    return bool(keys) and any(k.startswith('backbone.') for k in keys) and all(
        k.startswith('head.fc.') or (k.startswith('backbone.') and k[len('backbone.'):].startswith(roots))
        for k in keys)


class Layout(NamedTuple):
    """A family's own layout, registered by its model file (``register_layout``): ``detect(keys)`` says whether
    a state dict's keys are in it, ``read`` converts them to native, ``write`` (optional) back."""
    detect: Callable[[Sequence[str]], bool]
    read: Callable[[Mapping[str, torch.Tensor]], StateDict]
    write: Callable[[Mapping[str, torch.Tensor]], StateDict] | None = None


# The layouts model families register, tried before the built-in ones, in registration order.
LAYOUTS: dict[str, Layout] = {}


def register_layout(name: str, layout: Layout) -> None:
    """Make ``detect_layout``, ``to_native`` (and with ``layout.write``, ``from_native``) know ``name``."""
    if name in LAYOUTS or name in READERS:
        raise ValueError(f'layout {name!r} is registered already')
    LAYOUTS[name] = layout
    READERS[name] = layout.read
    if layout.write is not None:
        WRITERS[name] = layout.write


def detect_layout(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The layout of a state dict: one a model family registered (``register_layout``), 'native' (our models',
    official Twins/CPVT, timm ``twins_pcpvt_*`` and ``twins_svt_*``; any registered position encoding's keys
    included), 'classifier' (native inside an mmpretrain classifier), 'mmseg', 'mmpretrain' (its own ``PCPVT``
    or ``SVT``), 'deit' or 'rope_vit' (timm's RoPE ViTs)."""
    keys = list(state_dict)
    for name, layout in LAYOUTS.items():
        if layout.detect(keys):
            return name
    roots = native_roots()
    if any(_ROPE_VIT_ONLY.fullmatch(k) for k in keys):
        return 'rope_vit'
    if any(_QKV.fullmatch(k) for k in keys):
        return 'deit'
    if keys and all(k.startswith(roots) for k in keys):
        return 'native'
    if _is_our_classifier(keys, roots):
        return 'classifier'
    if any(k.startswith(('backbone.stages.', 'stages.', 'backbone.position_encodings.')) for k in keys):
        return 'mmpretrain'
    if any(k.startswith(('layers.', 'position_encodings.')) for k in keys):
        return 'mmseg'
    whole = any(k.startswith('backbone.') for k in keys)
    raise UnknownLayoutError('unrecognised checkpoint layout; expected official Twins/CPVT or timm keys '
                             '(patch_embeds.*, blocks.*, pos_block.*), mmseg PCPVT keys (layers.*), mmpretrain PCPVT '
                             'keys (backbone.stages.*), DeiT keys (blocks.N.attn.qkv.*) or timm RoPE ViT keys '
                             f'(blocks.N.gamma_1); first keys: {keys[:8]}'
                             + ('. Keys under backbone.: a whole detector\'s or segmentor\'s weights? Use them with '
                                'its config, or take the backbone alone with prefix backbone. '
                                '(tools/convert_checkpoint.py SRC DST --prefix backbone.)' if whole else ''))


# Each layout ``detect_layout`` names, read into native keys (DeiT's, which takes an option, by ``to_native``).
READERS: dict[str, Callable[[Mapping[str, torch.Tensor]], StateDict]] = {
    'native': dict, 'classifier': classifier_to_native, 'mmseg': mmseg_to_native, 'mmpretrain': mmpretrain_to_native,
    'rope_vit': rope_vit_to_native}
# Each layout ``from_native`` writes.
WRITERS: dict[str, Callable[[Mapping[str, torch.Tensor]], StateDict]] = {
    'native': dict, 'backbone': backbone_only, 'classifier': native_to_classifier, 'mmseg': native_to_mmseg,
    'mmpretrain': native_to_mmpretrain, 'rope_vit': native_to_rope_vit}


def to_native(state_dict: Mapping[str, torch.Tensor], drop_pos_embed: bool = False) -> StateDict:
    """Any known layout (see ``detect_layout``) -> native; ``drop_pos_embed`` as ``deit_to_native``'s."""
    layout = detect_layout(state_dict)
    if layout == 'deit':
        return deit_to_native(state_dict, drop_pos_embed)
    return READERS[layout](state_dict)


def from_native(state_dict: Mapping[str, torch.Tensor], layout: str) -> StateDict:
    """Native -> ``layout``: 'native' (unchanged), 'backbone' (no head), 'classifier' (our backbone in an
    mmpretrain classifier), 'mmseg', 'mmpretrain' or 'rope_vit'."""
    if layout not in WRITERS:
        raise ValueError(f'cannot write layout {layout!r}; choose one of {sorted(WRITERS)}')
    return WRITERS[layout](state_dict)
