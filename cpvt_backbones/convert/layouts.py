"""Pure key-layout converters between our (= official Twins = timm) layout and other frameworks'.

Each converter maps every key it is given or raises ``UnknownKeysError`` naming the keys it cannot place;
nothing is dropped silently. Ours is the reference layout, so official Twins/CPVT and timm ``twins_pcpvt_*``
weights need no conversion.
"""
import re
from typing import Callable, Dict, List, Mapping, Pattern, Sequence, Tuple

import torch

StateDict = Dict[str, torch.Tensor]

TWINS_ROOTS = ('patch_embeds.', 'patch_embed.', 'cls_token', 'blocks.', 'pos_block.', 'norm.', 'head.',
               'simple_fpn.')
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
_from_mmseg = _renamer([(b, a) for a, b in _MMSEG_RULES])
_IN_PROJ = re.compile(r'layers\.(\d+)\.(\d+)\.attn\.attn\.in_proj_(weight|bias)')
_Q_OR_KV = re.compile(r'blocks\.(\d+)\.(\d+)\.attn\.(q|kv)\.(weight|bias)')


def mmseg_to_twins(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """mmseg 1.x ``PCPVT`` backbone keys -> ours. ``in_proj`` (q; k; v stacked) splits into ``q`` and ``kv``."""
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


def detect_layout(state_dict: Mapping[str, torch.Tensor]) -> str:
    """'twins' (ours, official Twins/CPVT, timm) or 'mmseg'."""
    keys = list(state_dict)
    if keys and all(k.startswith(TWINS_ROOTS) for k in keys):
        return 'twins'
    if any(k.startswith(('layers.', 'position_encodings.')) for k in keys):
        return 'mmseg'
    raise ValueError('unrecognised checkpoint layout; expected official Twins/CPVT or timm keys '
                     f'(patch_embeds.*, blocks.*, pos_block.*) or mmseg PCPVT keys (layers.*); '
                     f'first keys: {keys[:8]}')


def to_twins(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    layout = detect_layout(state_dict)
    return dict(state_dict) if layout == 'twins' else mmseg_to_twins(state_dict)
