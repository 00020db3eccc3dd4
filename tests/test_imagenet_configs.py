"""configs/imagenet/: CPVT and PCPVT ImageNet-1k classification with the DeiT recipe, built by mmpretrain."""
import copy
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip('mmpretrain')
from mmengine.optim import OptimWrapper, build_optim_wrapper  # noqa: E402
from mmengine.registry import PARAM_SCHEDULERS, DefaultScope  # noqa: E402
from mmpretrain.registry import DATA_SAMPLERS, MODELS, TRANSFORMS  # noqa: E402
from mmpretrain.structures import DataSample  # noqa: E402

from cpvt_backbones.adapters.runner import read_config  # noqa: E402
from cpvt_backbones.layers.position import state_dict_roots  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / 'configs' / 'imagenet'

# config stem -> (backbone type, arch, head in_channels, drop path rate, expected parameters, relative tolerance)
EXPECTED = {
    'cpvt-tiny_8xb128_in1k': ('CPVT', 'cpvt_tiny', 192, 0.1, 5.7e6, 0.02),
    'cpvt-tiny-gap_8xb128_in1k': ('CPVT', 'cpvt_tiny_gap', 192, 0.1, 5.7e6, 0.02),
    'cpvt-small_8xb128_in1k': ('CPVT', 'cpvt_small', 384, 0.1, 22e6, 0.02),
    'cpvt-small-gap_8xb128_in1k': ('CPVT', 'cpvt_small_gap', 384, 0.1, 22e6, 0.02),
    'cpvt-base_8xb128_in1k': ('CPVT', 'cpvt_base', 768, 0.1, 86e6, 0.02),
    'cpvt-base-gap_8xb128_in1k': ('CPVT', 'cpvt_base_gap', 768, 0.1, 86e6, 0.02),
    'pcpvt-small_8xb128_in1k': ('PyramidCPVT', 'pcpvt_small', 512, 0.2, 24_106_216, 0),
    'pcpvt-base_8xb128_in1k': ('PyramidCPVT', 'pcpvt_base', 512, 0.3, 43_828_456, 0),
    'pcpvt-large_8xb128_in1k': ('PyramidCPVT', 'pcpvt_large', 512, 0.5, 60_989_672, 0),
    'svt-small_8xb128_in1k': ('TwinsSVT', 'svt_small', 512, 0.2, 24_060_776, 0),
    'svt-base_8xb128_in1k': ('TwinsSVT', 'svt_base', 768, 0.3, 56_070_952, 0),
    'svt-large_8xb128_in1k': ('TwinsSVT', 'svt_large', 1024, 0.5, 99_271_400, 0),
}
HEAVY = {'cpvt-base_8xb128_in1k', 'cpvt-base-gap_8xb128_in1k', 'pcpvt-base_8xb128_in1k',
         'pcpvt-large_8xb128_in1k', 'svt-base_8xb128_in1k', 'svt-large_8xb128_in1k'}
ALL = sorted(EXPECTED)
BY_SIZE = [pytest.param(n, marks=pytest.mark.heavy) if n in HEAVY else n for n in ALL]
SMALL_FORWARD = ['cpvt-tiny_8xb128_in1k', 'cpvt-tiny-gap_8xb128_in1k', 'pcpvt-small_8xb128_in1k',
                 'svt-small_8xb128_in1k']

GPUS, BATCH = 8, 128
LR = 5e-4 * GPUS * BATCH / 512
WD = 0.05
EPOCHS, WARMUP = 300, 5


@cache
def _load(name):
    return read_config(str(CONFIG_DIR / f'{name}.py'))


def load(name):
    return copy.deepcopy(_load(name))


def build_model(cfg):
    """As the Runner builds it: the top-level data_preprocessor goes into the model, mmpretrain's scope."""
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.setdefault('data_preprocessor', copy.deepcopy(cfg.data_preprocessor))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(model_cfg)


def has_class_token(name):
    return name.startswith('cpvt-') and '-gap' not in name


def test_every_config_is_expected():
    assert sorted(p.stem for p in CONFIG_DIR.glob('*.py')) == ALL
    for name in ALL:
        text = (CONFIG_DIR / f'{name}.py').read_text()
        assert text.startswith('# '), f'{name} starts without a comment saying what it is'


def lr_per_epoch(cfg, epoch_length=3):
    """The learning rate at the first iteration of each epoch, stepping the schedulers as the Runner does
    (a missing ``end`` is max_epochs; ``convert_to_iter_based`` schedulers step per iteration)."""
    param = torch.nn.Parameter(torch.zeros(1))
    wrapper = OptimWrapper(torch.optim.AdamW([param], lr=cfg.optim_wrapper.optimizer.lr))
    per_iter, per_epoch = [], []
    for sched in copy.deepcopy(cfg.param_scheduler):
        sched.setdefault('end', cfg.train_cfg.max_epochs)
        cls = PARAM_SCHEDULERS.get(sched.pop('type'))
        if sched.pop('convert_to_iter_based', False):
            per_iter.append(cls.build_iter_from_epoch(wrapper, epoch_length=epoch_length, **sched))
        else:
            per_epoch.append(cls(wrapper, **sched))
    lrs = []
    for _ in range(cfg.train_cfg.max_epochs):
        lrs.append(wrapper.get_lr()['lr'][0])
        for _ in range(epoch_length):
            wrapper.step()
            for s in per_iter:
                s.step()
        for s in per_epoch:
            s.step()
    return lrs


@pytest.mark.parametrize('name', ALL)
def test_recipe(name):
    cfg = load(name)
    kind, arch, width, drop_path, _, _ = EXPECTED[name]
    assert cfg.custom_imports.imports == ['cpvt_backbones.adapters.mmpretrain', 'cpvt_backbones.adapters.checkpoint',
                                          'cpvt_backbones.adapters.hooks']
    assert not cfg.custom_imports.allow_failed_imports
    assert cfg.default_scope == 'mmpretrain'

    model = cfg.model
    assert model.type == 'ImageClassifier' and model.neck is None
    backbone = model.backbone
    assert (backbone.type, backbone.arch, backbone.out_type) == (kind, arch, 'pooled')
    assert backbone.drop_path_rate == drop_path and backbone.get('out_indices') is None
    head = model.head
    assert (head.type, head.num_classes, head.in_channels) == ('LinearClsHead', 1000, width)
    assert head.loss == dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original')
    assert model.train_cfg.augments == [dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]
    assert cfg.data_preprocessor.num_classes == 1000

    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW' and math.isclose(opt.lr, 1e-3) and math.isclose(opt.lr, LR)
    assert opt.weight_decay == WD
    assert cfg.optim_wrapper.clip_grad == dict(max_norm=5.0)
    paramwise = cfg.optim_wrapper.paramwise_cfg
    assert paramwise.norm_decay_mult == paramwise.bias_decay_mult == paramwise.flat_decay_mult == 0
    keys = paramwise.custom_keys
    assert set(keys) == {*state_dict_roots(), 'cls_token'}  # every position encoding's, as tests/test_weight_decay
    assert all(v == dict(decay_mult=0.0) for v in keys.values())
    assert cfg.auto_scale_lr.base_batch_size == GPUS * BATCH == 1024

    assert cfg.train_cfg.by_epoch and cfg.train_cfg.max_epochs == EPOCHS
    lrs = lr_per_epoch(cfg)
    assert math.isclose(lrs[0], LR * 1e-3)
    assert all(a < b for a, b in zip(lrs[:WARMUP], lrs[1:WARMUP + 1], strict=False))
    assert math.isclose(lrs[WARMUP], LR)
    assert all(a > b for a, b in zip(lrs[WARMUP:], lrs[WARMUP + 1:], strict=False))
    for epoch in (WARMUP + 1, (EPOCHS + WARMUP) // 2, EPOCHS - 1):
        cosine = 1e-5 + (LR - 1e-5) * (1 + math.cos(math.pi * (epoch - WARMUP) / (EPOCHS - WARMUP))) / 2
        assert math.isclose(lrs[epoch], cosine, rel_tol=1e-4), epoch
    assert 1e-5 < lrs[-1] < 1.01e-5

    train = cfg.train_dataloader
    assert train.batch_size == BATCH
    assert train.sampler == dict(type='RepeatAugSampler', num_repeats=3, shuffle=True)
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # not whichever scope an earlier Runner left
        sampler = DATA_SAMPLERS.build(train.sampler, default_args=dict(dataset=list(range(12)), seed=0))
    assert type(sampler).__name__ == 'RepeatAugSampler' and sampler.num_repeats == 3
    assert (train.dataset.type, train.dataset.data_root, train.dataset.split) == ('ImageNet', 'data/imagenet', 'train')
    steps = {t.type: t for t in train.dataset.pipeline}
    assert steps['RandomResizedCrop'].scale == 224 and steps['RandomResizedCrop'].interpolation == 'bicubic'
    rand_aug = steps['RandAugment']
    assert rand_aug.policies == 'timm_increasing' and rand_aug.num_policies == 2
    assert rand_aug.magnitude_level == 9 and rand_aug.magnitude_std == 0.5 and rand_aug.total_level == 10
    erasing = steps['RandomErasing']
    assert erasing.erase_prob == 0.25 and erasing.mode == 'rand'
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        for step in train.dataset.pipeline:
            TRANSFORMS.build(step)

    assert cfg.test_resolutions == [224, 384, 448, 512] and cfg.crop_ratio == 0.875
    for loader, split in ((cfg.val_dataloader, 'val'), (cfg.test_dataloader, 'val')):
        assert (loader.dataset.type, loader.dataset.data_root, loader.dataset.split) == ('ImageNet', 'data/imagenet',
                                                                                        split)
        types = [t.type for t in loader.dataset.pipeline]
        assert types == ['LoadImageFromFile', 'ResizeEdge', 'CenterCrop', 'PackInputs']
        resize, crop = loader.dataset.pipeline[1], loader.dataset.pipeline[2]
        assert (resize.scale, resize.edge, resize.interpolation) == (256, 'short', 'bicubic')
        assert crop.crop_size == 224 and crop.crop_size / resize.scale == cfg.crop_ratio
    assert cfg.val_evaluator.type == 'Accuracy'


@pytest.mark.parametrize('name', BY_SIZE)
def test_model_size_and_weight_decay(name):
    cfg = load(name)
    kind, _, width, drop_path, params, rel = EXPECTED[name]
    model = build_model(cfg)
    backbone = model.backbone
    assert type(backbone).__name__ == kind
    assert backbone.norm.normalized_shape == (width,)
    drop_paths = [m.drop_prob for m in backbone.modules() if type(m).__name__ == 'DropPath']
    assert drop_paths and math.isclose(max(drop_paths), drop_path, rel_tol=1e-6)

    count = sum(p.numel() for p in model.parameters())
    if rel:
        assert abs(count - params) <= rel * params, count
    else:
        assert count == params

    names = {id(p): n for n, p in model.named_parameters()}
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys  # one per position encoding: they match its parameters only
    assert {n for n in names.values() if any(key in n for key in keys)} == \
        {f'backbone.{n}' for n in model.backbone.no_weight_decay()}
    assert ('backbone.cls_token' in names.values()) == has_class_token(name)

    with DefaultScope.overwrite_default_scope('mmpretrain'):
        wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    assert wrapper.clip_grad_kwargs == dict(max_norm=5.0)
    decay = {}
    for group in wrapper.optimizer.param_groups:
        assert len(group['params']) == 1 and math.isclose(group['lr'], LR)
        decay[names[id(group['params'][0])]] = group['weight_decay']
    assert set(decay) == set(names.values())

    params_by_name = dict(model.named_parameters())
    for n, wd in decay.items():
        no_decay = 'pos_block' in n or n == 'backbone.cls_token' or params_by_name[n].ndim == 1
        assert wd == (0 if no_decay else WD), (n, wd)

    peg_weights = [n for n in decay if n.startswith('backbone.pos_block.') and n.endswith('.weight')]
    assert peg_weights and all(params_by_name[n].ndim == 4 for n in peg_weights)
    assert all(decay[n] == 0 for n in peg_weights)
    assert decay['backbone.norm.weight'] == decay['backbone.norm.bias'] == 0
    assert decay['head.fc.bias'] == 0 and decay['head.fc.weight'] == WD
    patch_conv = next(n for n in decay if n.startswith('backbone.patch_embed') and n.endswith('proj.weight'))
    assert params_by_name[patch_conv].ndim == 4 and decay[patch_conv] == WD
    first_block = 'backbone.blocks.0.' if kind == 'CPVT' else 'backbone.blocks.0.0.'
    query = 'attn.qkv' if kind == 'TwinsSVT' else 'attn.q'   # SVT's first block attends within windows
    assert decay[first_block + f'{query}.weight'] == decay[first_block + 'mlp.fc1.weight'] == WD
    assert decay[first_block + f'{query}.bias'] == decay[first_block + 'norm1.weight'] == 0
    if has_class_token(name):
        assert decay['backbone.cls_token'] == 0


@pytest.mark.parametrize('name', SMALL_FORWARD)
def test_loss_step_with_mixup_and_cutmix(name, monkeypatch):
    """The training step of the recipe on 2 tiny images: the data preprocessor mixes the batch with Mixup or
    CutMix (soft targets; both are exercised), the head takes the label-smoothed loss, every parameter gets a
    gradient (checked on the first mixed batch)."""
    cfg = load(name)
    model = build_model(cfg)
    model.init_weights()
    model.train()
    augments = model.data_preprocessor.batch_augments
    assert [(type(a).__name__, a.alpha) for a in augments.augments] == [('Mixup', 0.8), ('CutMix', 1.0)]
    used = []
    for aug in augments.augments:
        cls = type(aug)

        def mix(self, *args, _cls=cls, _mix=cls.mix, **kwargs):
            used.append(_cls.__name__)
            return _mix(self, *args, **kwargs)
        monkeypatch.setattr(cls, 'mix', mix)

    labels = [3, 997]
    covered = set()
    for seed in range(20):
        np.random.seed(seed)
        torch.manual_seed(seed)
        batch = dict(inputs=[torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8) for _ in labels],
                     data_samples=[DataSample().set_gt_label(label) for label in labels])
        used.clear()
        data = model.data_preprocessor(batch, training=True)
        assert len(used) == 1
        scores = torch.stack([s.gt_score for s in data['data_samples']])
        assert data['inputs'].shape == (2, 3, 64, 64) and scores.shape == (2, 1000)
        assert torch.allclose(scores.sum(1), torch.ones(2))
        if used[0] in covered or not ((scores[:, labels] > 0) & (scores[:, labels] < 1)).all():
            continue
        covered.add(used[0])

        losses = model(**data, mode='loss')
        assert set(losses) == {'loss'}
        loss, _ = model.parse_losses(losses)
        assert torch.isfinite(loss) and loss.item() > 0
        if len(covered) == 1:
            loss.backward()
            missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            assert not missing
        else:
            break
    assert covered == {'Mixup', 'CutMix'}
