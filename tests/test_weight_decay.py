"""The configs keep every position encoding's parameters and the class token out of weight decay, whichever
registered encoding the backbone is built with (mmengine's own optimizer-wrapper construction applies their
``paramwise_cfg``)."""
import copy
from functools import cache
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip('mmengine')
from mmengine.config import Config  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402

from cpvt_backbones import create_model  # noqa: E402
from cpvt_backbones.adapters.runner import read_config  # noqa: E402
from cpvt_backbones.layers.position import ENCODINGS, state_dict_roots  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / 'configs').rglob('*.py') if '_base_' not in p.parts)
# The paper's 1x detection and ADE20K segmentation recipes (Twins' settings) decay every parameter.
DECAY_ALL = {'retinanet_pcpvt-s_fpn_1x_coco.py', 'retinanet_pcpvt-b_fpn_1x_coco.py', 'retinanet_pcpvt-l_fpn_1x_coco.py',
             'retinanet_cpvt-s-gap_fpn_1x_coco.py', 'fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py',
             'fpn_pcpvt-b_8xb2-80k_ade20k-512x512.py', 'fpn_pcpvt-l_8xb2-80k_ade20k-512x512.py',
             # the Twins release's 1x recipes (PVT setting) and the SVT Semantic FPN decay every parameter too
             *(f'{head}_{b}-{s}_fpn_1x_coco.py' for head in ('retinanet', 'mask-rcnn') for b in ('pcpvt', 'svt')
               for s in 'sbl' if (head, b) != ('retinanet', 'pcpvt')),
             *(f'fpn_svt-{s}_8xb2-80k_ade20k-512x512.py' for s in 'sbl'),
             # mmdet's PVTv2 RetinaNet and the PVTv2 release's Semantic FPN decay every parameter as well
             *(f'retinanet_pvtv2-b{b}_fpn_1x_coco.py' for b in range(6)),
             *(f'fpn_pvtv2-b{b}_8xb4-40k_ade20k-512x512.py' for b in range(3))}
EXEMPTING = [p for p in CONFIGS if p.name not in DECAY_ALL]
# Both families at tiny sizes; the columnar one with its class token.
SMALL = {'pcpvt_tiny': dict(depths=(2, 1, 1, 1)), 'cpvt_tiny': dict(depth=3)}
# The weight-decay exemptions the configs share (their optim_wrapper's custom_keys include them).
SHARED = read_config(str(ROOT / 'configs/_base_/position_no_decay.py')).position_no_decay


@cache
def load(path: Path) -> Config:
    return read_config(str(path))


@cache
def backbone(name: str, encoding: str) -> nn.Module:
    torch.manual_seed(0)
    return create_model(name, pos_encoding=encoding, **SMALL[name])


def custom_keys(cfg: Config) -> dict:
    return cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {})


def weight_decay(cfg: Config, inner: nn.Module) -> dict:
    """The weight decay each parameter of a model holding ``inner`` as its backbone (as the configs' detectors,
    segmentors and classifiers do) gets from the optimizer that the config's ``optim_wrapper`` builds."""
    model = nn.Module()
    model.backbone = inner
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: group['weight_decay'] for group in wrapper.optimizer.param_groups for p in group['params']}
    assert set(decay) == set(names.values())
    return decay


def test_the_shared_keys_name_every_registered_encoding_and_the_class_token():
    assert set(SHARED) == {*state_dict_roots(), 'cls_token'}
    assert all(v == dict(decay_mult=0.) for v in SHARED.values())


def test_which_configs_exempt_parameters():
    assert {p.name for p in CONFIGS if not custom_keys(load(p))} == DECAY_ALL
    for path in EXEMPTING:
        keys = custom_keys(load(path))
        assert all(keys.get(k) == v for k, v in SHARED.items()), path.name


@pytest.mark.parametrize('path', EXEMPTING, ids=lambda p: p.name)
def test_no_position_parameter_is_decayed(path):
    cfg = load(path)
    pytest.importorskip(cfg.default_scope)
    assert 'constructor' not in cfg.optim_wrapper  # mmengine's default constructor: custom_keys are substrings
    assert cfg.optim_wrapper.optimizer.weight_decay > 0
    for name in SMALL:
        for encoding in sorted(ENCODINGS):
            inner = backbone(name, encoding)
            exempt = {f'backbone.{n}' for n in inner.no_weight_decay()}
            position = {f'backbone.{n}' for n, _ in inner.named_parameters()
                        if n.startswith(tuple(f'{attr}.' for attr in inner.pos_encoding_attrs))}
            assert position <= exempt and (name != 'cpvt_tiny' or 'backbone.cls_token' in exempt)
            decay = weight_decay(cfg, inner)
            decayed = sorted(n for n in exempt if decay[n] > 0)
            assert not decayed, f'{path.name}, {name} with {encoding!r}: weight decay on {decayed}'
            matched = {n for n in decay if any(key in n for key in SHARED)}
            assert matched == exempt, f'{path.name}, {name} with {encoding!r}: {sorted(matched ^ exempt)}'
