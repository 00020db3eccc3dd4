"""Pure key-layout converters between our (= official Twins = timm) layout and other frameworks'.

Each converter maps every key it is given or raises ``UnknownKeysError`` naming the keys it cannot place;
nothing is dropped silently. Ours is the reference layout, so official Twins/CPVT and timm ``twins_pcpvt_*``
weights need no conversion.
"""
import re
from typing import Callable, Dict, List, Mapping, Pattern, Sequence, Tuple

import torch

StateDict = Dict[str, torch.Tensor]

TWINS_ROOTS = ('patch_embeds.', 'patch_embed.', 'cls_token', 'pos_embed.', 'blocks.', 'pos_block.', 'pos_qk.',
               'rel_pos.', 'rope.', 'norm.', 'head.', 'simple_fpn.')
# Keys of the classifier that mmseg's / mmpretrain's dense backbones have no place for.
CLASSIFIER_ONLY = ('norm.', 'head.')


class UnknownKeysError(KeyError):
    def __init__(self, layout: str, keys: Sequence[str]):
        keys = sorted(keys)
        shown = ', '.join(keys[:20]) + (f', ... ({len(keys) - 20} more)' if len(keys) > 20 else '')
        super().__init__(f'{len(keys)} key(s) are not part of the {layout} layout: {shown}')

    def __str__(self) -> str:
        return self.args[0]


def _compile(template: str) -> Pattern:
    pattern = re.escape(template)
    for name, group in (('i', r'\d+'), ('j', r'\d+'), ('p', r'weight|bias')):
        pattern = pattern.replace(re.escape('{%s}' % name), f'(?P<{name}>{group})')
    return re.compile(pattern)


def _renamer(rules: Sequence[Tuple[str, str]]) -> Callable[[str], str]:
    """Rename by the first matching (source template, target template) rule; None when nothing matches."""
    compiled = [(_compile(src), dst) for src, dst in rules]

    def rename(key: str):
        for pattern, dst in compiled:
            m = pattern.fullmatch(key)
            if m:
                return dst.format(**m.groupdict())
        return None
    return rename


# (ours, mmseg) for mmseg 1.x ``PCPVT``; q and kv are merged into nn.MultiheadAttention's in_proj separately.
_MMSEG_RULES = [
    ('patch_embeds.{i}.proj.{p}', 'patch_embeds.{i}.projection.{p}'),
    ('patch_embeds.{i}.norm.{p}', 'patch_embeds.{i}.norm.{p}'),
    ('pos_block.{i}.proj.0.{p}', 'position_encodings.{i}.proj.{p}'),
    ('blocks.{i}.{j}.norm1.{p}', 'layers.{i}.{j}.norm1.{p}'),
    ('blocks.{i}.{j}.norm2.{p}', 'layers.{i}.{j}.norm2.{p}'),
    ('blocks.{i}.{j}.attn.proj.{p}', 'layers.{i}.{j}.attn.attn.out_proj.{p}'),
    ('blocks.{i}.{j}.attn.sr.{p}', 'layers.{i}.{j}.attn.sr.{p}'),
    ('blocks.{i}.{j}.attn.norm.{p}', 'layers.{i}.{j}.attn.norm.{p}'),
    ('blocks.{i}.{j}.mlp.fc1.{p}', 'layers.{i}.{j}.ffn.layers.0.0.{p}'),
    ('blocks.{i}.{j}.mlp.fc2.{p}', 'layers.{i}.{j}.ffn.layers.1.{p}'),
]
_to_mmseg = _renamer(_MMSEG_RULES)
# mmseg's own converter (tools/model_converters/twins2mmseg.py, which made its published PCPVT weights) keeps
# the classifier's final ``norm``; mmseg's backbone ignores it on load, and so does our dense backbone.
_from_mmseg = _renamer([(b, a) for a, b in _MMSEG_RULES] + [('norm.{p}', 'norm.{p}')])
_IN_PROJ = re.compile(r'layers\.(\d+)\.(\d+)\.attn\.attn\.in_proj_(weight|bias)')
_Q_OR_KV = re.compile(r'blocks\.(\d+)\.(\d+)\.attn\.(q|kv)\.(weight|bias)')


def mmseg_to_twins(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """mmseg 1.x ``PCPVT`` backbone keys -> ours. ``in_proj`` (q; k; v stacked) splits into ``q`` and ``kv``;
    a final ``norm`` (as mmseg's converter writes it) is kept."""
    out: StateDict = {}
    unknown: List[str] = []
    for key, value in state_dict.items():
        m = _IN_PROJ.fullmatch(key)
        if m:
            i, j, p = m.groups()
            dim = value.shape[0] // 3
            out[f'blocks.{i}.{j}.attn.q.{p}'] = value[:dim]
            out[f'blocks.{i}.{j}.attn.kv.{p}'] = value[dim:]
            continue
        new = _from_mmseg(key)
        if new is None:
            unknown.append(key)
        else:
            out[new] = value
    if unknown:
        raise UnknownKeysError('mmseg PCPVT', unknown)
    return out


def twins_to_mmseg(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Ours -> mmseg 1.x ``PCPVT`` backbone keys. The classifier's final ``norm`` and ``head`` have no
    counterpart in mmseg's backbone and are left out; any other key that does not fit raises."""
    out: StateDict = {}
    unknown: List[str] = []
    pending: Dict[Tuple[str, str, str], Dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        if key.startswith(CLASSIFIER_ONLY):
            continue
        m = _Q_OR_KV.fullmatch(key)
        if m:
            i, j, which, p = m.groups()
            pending.setdefault((i, j, p), {})[which] = value
            continue
        new = _to_mmseg(key)
        if new is None:
            unknown.append(key)
        else:
            out[new] = value
    for (i, j, p), parts in pending.items():
        if set(parts) != {'q', 'kv'}:
            unknown += [f'blocks.{i}.{j}.attn.{w}.{p}' for w in parts]
            continue
        out[f'layers.{i}.{j}.attn.attn.in_proj_{p}'] = torch.cat((parts['q'], parts['kv']), dim=0)
    if unknown:
        raise UnknownKeysError('our (Twins/timm) PCPVT', unknown)
    return out


# (ours, mmpretrain) for mmpretrain 1.x ``PCPVT`` inside an ``ImageClassifier`` (GAP neck, LinearClsHead).
_MMPRETRAIN_RULES = [
    ('patch_embeds.{i}.proj.{p}', 'backbone.patch_embeds.{i}.projection.{p}'),
    ('patch_embeds.{i}.norm.{p}', 'backbone.patch_embeds.{i}.norm.{p}'),
    ('pos_block.{i}.proj.0.{p}', 'backbone.position_encodings.{i}.proj.{p}'),
    ('blocks.{i}.{j}.mlp.fc1.{p}', 'backbone.stages.{i}.{j}.ffn.layers.0.0.{p}'),
    ('blocks.{i}.{j}.mlp.fc2.{p}', 'backbone.stages.{i}.{j}.ffn.layers.1.{p}'),
] + [(f'blocks.{{i}}.{{j}}.{m}.{{p}}', f'backbone.stages.{{i}}.{{j}}.{m}.{{p}}')
     for m in ('norm1', 'norm2', 'attn.q', 'attn.kv', 'attn.sr', 'attn.norm', 'attn.proj')] + [
    ('norm.{p}', 'backbone.norm_after_stage3.{p}'),
    ('head.{p}', 'head.fc.{p}'),
]
_to_mmpretrain = _renamer(_MMPRETRAIN_RULES)
_from_mmpretrain = _renamer([(b, a) for a, b in _MMPRETRAIN_RULES])


def _rename_all(state_dict: Mapping[str, torch.Tensor], rename: Callable[[str], str], layout: str) -> StateDict:
    out: StateDict = {}
    unknown: List[str] = []
    for key, value in state_dict.items():
        new = rename(key)
        if new is None:
            unknown.append(key)
        else:
            out[new] = value
    if unknown:
        raise UnknownKeysError(layout, unknown)
    return out


def mmpretrain_to_twins(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """mmpretrain 1.x ``PCPVT`` keys -> ours: a whole classifier (``backbone.*``, ``head.fc.*``) or its
    backbone alone (keys without the ``backbone.`` prefix)."""
    if not any(k.startswith(('backbone.', 'head.fc.')) for k in state_dict):
        state_dict = {f'backbone.{k}': v for k, v in state_dict.items()}
    return _rename_all(state_dict, _from_mmpretrain, 'mmpretrain PCPVT')


def twins_to_mmpretrain(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Ours -> an mmpretrain 1.x ``ImageClassifier`` with its ``PCPVT`` backbone (``norm_after_stage`` on the
    last stage only, as in mmpretrain's Twins configs) and a ``LinearClsHead``."""
    return _rename_all(state_dict, _to_mmpretrain, 'our (Twins/timm) PCPVT')


_DEIT_RULES = [('cls_token', 'cls_token'), ('patch_embed.proj.{p}', 'patch_embed.proj.{p}'),
               ('pos_block.{i}.proj.0.{p}', 'pos_block.{i}.proj.0.{p}'), ('norm.{p}', 'norm.{p}'),
               ('head.{p}', 'head.{p}')] + [
    (f'blocks.{{i}}.{m}.{{p}}', f'blocks.{{i}}.{m}.{{p}}')
    for m in ('norm1', 'norm2', 'attn.proj', 'mlp.fc1', 'mlp.fc2')]
_from_deit = _renamer(_DEIT_RULES)
_QKV = re.compile(r'blocks\.(\d+)\.attn\.qkv\.(weight|bias)')
_Q_OR_KV_COLUMNAR = re.compile(r'blocks\.(\d+)\.attn\.(q|kv)\.(weight|bias)')


def deit_to_twins(state_dict: Mapping[str, torch.Tensor], drop_pos_embed: bool = False) -> StateDict:
    """DeiT / timm ViT keys (fused ``attn.qkv``) -> our columnar CPVT (``attn.q`` + ``attn.kv``).

    DeiT's ``pos_embed`` becomes ``pos_embed.0`` (it fits a CPVT built with ``pos_encoding=dict(type='learned',
    img_size=224)``, and is an unexpected key for one without) unless ``drop_pos_embed=True``: starting CPVT
    from DeiT weights, whose PEGs then start fresh (load with ``strict=False``). Distillation tokens and heads
    have no counterpart and raise.
    """
    out: StateDict = {}
    unknown: List[str] = []
    for key, value in state_dict.items():
        m = _QKV.fullmatch(key)
        if m:
            j, p = m.groups()
            dim = value.shape[0] // 3
            out[f'blocks.{j}.attn.q.{p}'] = value[:dim]
            out[f'blocks.{j}.attn.kv.{p}'] = value[dim:]
        elif key == 'pos_embed':
            if not drop_pos_embed:
                out['pos_embed.0'] = value
        else:
            new = _from_deit(key)
            if new is None:
                unknown.append(key)
            else:
                out[new] = value
    if unknown:
        raise UnknownKeysError('DeiT/timm ViT', unknown)
    return out


_ROPE_VIT_SAME = _renamer(_DEIT_RULES[:2] + _DEIT_RULES[3:])
_ROPE_VIT_ONLY = re.compile(r'rope\.freqs|blocks\.\d+\.gamma_[12]')
_OUR_ROPE = re.compile(r'rope\.freqs\.(\d+)')
_OUR_SCALE = re.compile(r'blocks\.(\d+)\.ls([12])\.gamma')


def rope_vit_to_twins(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """timm's RoPE ViTs (Heo et al.; ``timm.models.eva``'s ``vit_*_patch16_rope_224`` and
    ``..._rope_mixed_224``) -> our columnar model built as they are: ``pos_encoding='rope_axial'`` or
    ``'rope_mixed'``, ``layer_scale_init`` set (``tests/test_position.py`` has the settings).

    ``attn.qkv`` splits into ``attn.q`` / ``attn.kv`` (as DeiT's), ``gamma_1/2`` are the layer scales
    ``ls1/ls2.gamma``, and ``rope.freqs`` (2, depth, heads, head_dim / 2) splits into one ``rope.freqs.{j}``
    per block. Anything else raises ``UnknownKeysError``."""
    out: StateDict = {}
    unknown: List[str] = []
    for key, value in state_dict.items():
        qkv, gamma = _QKV.fullmatch(key), re.fullmatch(r'blocks\.(\d+)\.gamma_([12])', key)
        if key == 'rope.freqs':
            out.update({f'rope.freqs.{j}': value[:, j].clone() for j in range(value.shape[1])})
        elif qkv:
            j, p = qkv.groups()
            dim = value.shape[0] // 3
            out[f'blocks.{j}.attn.q.{p}'], out[f'blocks.{j}.attn.kv.{p}'] = value[:dim], value[dim:]
        elif gamma:
            out[f'blocks.{gamma.group(1)}.ls{gamma.group(2)}.gamma'] = value
        elif _ROPE_VIT_SAME(key) is not None:
            out[_ROPE_VIT_SAME(key)] = value
        else:
            unknown.append(key)
    if unknown:
        raise UnknownKeysError('timm RoPE ViT', unknown)
    return out


def twins_to_rope_vit(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Ours (a columnar model with RoPE, see ``rope_vit_to_twins``) -> timm's RoPE ViT keys; keys of other
    position encodings (a PEG) have no place there and raise ``UnknownKeysError``."""
    out: StateDict = {}
    unknown: List[str] = []
    pending: Dict[Tuple[str, str], Dict[str, torch.Tensor]] = {}
    freqs: Dict[int, torch.Tensor] = {}
    for key, value in state_dict.items():
        rope, scale, qkv = _OUR_ROPE.fullmatch(key), _OUR_SCALE.fullmatch(key), _Q_OR_KV_COLUMNAR.fullmatch(key)
        if rope:
            freqs[int(rope.group(1))] = value
        elif scale:
            out[f'blocks.{scale.group(1)}.gamma_{scale.group(2)}'] = value
        elif qkv:
            j, which, p = qkv.groups()
            pending.setdefault((j, p), {})[which] = value
        elif _ROPE_VIT_SAME(key) is not None:
            out[_ROPE_VIT_SAME(key)] = value
        else:
            unknown.append(key)
    for (j, p), parts in pending.items():
        if set(parts) != {'q', 'kv'}:
            unknown += [f'blocks.{j}.attn.{w}.{p}' for w in parts]
        else:
            out[f'blocks.{j}.attn.qkv.{p}'] = torch.cat((parts['q'], parts['kv']))
    if freqs:
        if sorted(freqs) != list(range(len(freqs))):
            raise ValueError(f'rope.freqs.{{j}} must cover blocks 0..{len(freqs) - 1}, got {sorted(freqs)}')
        out['rope.freqs'] = torch.stack([freqs[j] for j in range(len(freqs))], dim=1)
    if unknown:
        raise UnknownKeysError('our columnar model with RoPE', unknown)
    return out


def backbone_only(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Our layout without the classifier head: the checkpoint a dense config's ``init_cfg`` points at."""
    sd = to_twins(state_dict)
    return {k: v for k, v in sd.items() if not k.startswith('head.')}


def classifier_to_twins(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Our backbone inside an mmpretrain ``ImageClassifier`` (``backbone.*`` in our layout, ``head.fc.*``),
    e.g. a checkpoint of ``configs/imagenet`` -> ours."""
    def rename(key: str):
        if key.startswith('head.fc.'):
            return 'head.' + key[len('head.fc.'):]
        inner = key[len('backbone.'):] if key.startswith('backbone.') else ''
        return inner if inner.startswith(TWINS_ROOTS) and not inner.startswith('head.') else None
    return _rename_all(state_dict, rename, 'mmpretrain ImageClassifier with our backbone')


def twins_to_classifier(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """Ours -> our backbone inside an mmpretrain ``ImageClassifier`` (``backbone.*``, ``head.fc.*``): the keys
    of a checkpoint of ``configs/imagenet`` (the inverse of ``classifier_to_twins``)."""
    out: StateDict = {}
    unknown: List[str] = []
    for key, value in state_dict.items():
        if key.startswith('head.'):
            out['head.fc.' + key[len('head.'):]] = value
        elif key.startswith(TWINS_ROOTS):
            out['backbone.' + key] = value
        else:
            unknown.append(key)
    if unknown:
        raise UnknownKeysError('our (Twins/timm) layout', unknown)
    return out


def _is_our_classifier(keys: Sequence[str]) -> bool:
    return bool(keys) and any(k.startswith('backbone.') for k in keys) and all(
        k.startswith('head.fc.') or (k.startswith('backbone.') and k[len('backbone.'):].startswith(TWINS_ROOTS))
        for k in keys)


def detect_layout(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The layout of a state dict: 'twins' (ours, official Twins/CPVT, timm ``twins_pcpvt_*``), 'classifier' (ours
    inside an mmpretrain classifier), 'mmseg', 'mmpretrain' (its own ``PCPVT``), 'deit' or 'rope_vit' (timm's
    RoPE ViTs)."""
    keys = list(state_dict)
    if any(_ROPE_VIT_ONLY.fullmatch(k) for k in keys):
        return 'rope_vit'
    if any(_QKV.fullmatch(k) for k in keys):
        return 'deit'
    if keys and all(k.startswith(TWINS_ROOTS) for k in keys):
        return 'twins'
    if _is_our_classifier(keys):
        return 'classifier'
    if any(k.startswith(('backbone.stages.', 'stages.', 'backbone.position_encodings.')) for k in keys):
        return 'mmpretrain'
    if any(k.startswith(('layers.', 'position_encodings.')) for k in keys):
        return 'mmseg'
    raise ValueError('unrecognised checkpoint layout; expected official Twins/CPVT or timm keys '
                     '(patch_embeds.*, blocks.*, pos_block.*), mmseg PCPVT keys (layers.*), mmpretrain PCPVT '
                     'keys (backbone.stages.*), DeiT keys (blocks.N.attn.qkv.*) or timm RoPE ViT keys '
                     f'(blocks.N.gamma_1); '
                     f'first keys: {keys[:8]}')


def to_twins(state_dict: Mapping[str, torch.Tensor], drop_pos_embed: bool = False) -> StateDict:
    """Any known layout -> ours (see ``detect_layout``)."""
    layout = detect_layout(state_dict)
    if layout == 'deit':
        return deit_to_twins(state_dict, drop_pos_embed)
    readers = {'rope_vit': rope_vit_to_twins, 'twins': dict, 'classifier': classifier_to_twins, 'mmseg': mmseg_to_twins,
               'mmpretrain': mmpretrain_to_twins}
    return readers[layout](state_dict)


def from_twins(state_dict: Mapping[str, torch.Tensor], layout: str) -> StateDict:
    """Ours -> ``layout``: 'twins' (unchanged), 'backbone' (no head), 'classifier' (our backbone in an mmpretrain
    classifier), 'mmseg', 'mmpretrain' or 'rope_vit'."""
    writers = {'twins': dict, 'backbone': backbone_only, 'classifier': twins_to_classifier, 'mmseg': twins_to_mmseg,
               'mmpretrain': twins_to_mmpretrain, 'rope_vit': twins_to_rope_vit}
    if layout not in writers:
        raise ValueError(f'cannot write layout {layout!r}; choose one of {sorted(writers)}')
    return writers[layout](state_dict)
