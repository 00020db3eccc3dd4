"""Every config in configs/ builds, runs loss and predict on odd-sized images, and matches the paper's size."""
import importlib
from pathlib import Path

import numpy as np
import pytest
import torch

for _framework in ('mmengine', 'mmdet', 'mmseg'):
    pytest.importorskip(_framework)
from mmengine.config import Config  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402

from cpvt_backbones.adapters.runner import read_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DENSE = sorted(p for d in ('retinanet', 'mask_rcnn', 'sem_fpn', 'upernet', 'shapes')
               for p in (ROOT / 'configs' / d).glob('*.py')
               if not p.stem.endswith('-cls'))  # the classification config has its own test below
# A training step and inference run once per head and once per backbone family and task, on the small backbones
# (the base and large configs and the 3x recipes build the same code with other sizes or schedules; UperNet runs
# on the shapes PCPVT, Twins-SVT under RetinaNet, Mask R-CNN and Semantic FPN: their recipes, keys and sizes are
# checked below without a training step).
SAME_PATH = ('-b_', '-l_', 'retinanet_svt-s_fpn_ms', 'mask-rcnn_pcpvt-s_fpn_ms', 'mask-rcnn_svt-s_fpn_ms',
             'upernet_pcpvt-s', 'upernet_svt-s', *(f'pvtv2-b{b}_' for b in range(1, 6)))
STEPPED = [p for p in DENSE if not any(k in p.name for k in SAME_PATH)]
# Paper parameter counts less the 513,000-parameter ImageNet head left in the Twins backbones.
EXPECTED_PARAMS = {
    'retinanet_pcpvt-s_fpn_1x_coco.py': 33.84e6, 'retinanet_pcpvt-b_fpn_1x_coco.py': 53.57e6,
    'retinanet_pcpvt-l_fpn_1x_coco.py': 70.73e6, 'retinanet_pcpvt-s_fpn_ms-crop-3x_coco.py': 33.84e6,
    'retinanet_pcpvt-b_fpn_ms-crop-3x_coco.py': 53.57e6, 'fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py': 27.86e6,
    'fpn_pcpvt-b_8xb2-80k_ade20k-512x512.py': 47.58e6, 'fpn_pcpvt-l_8xb2-80k_ade20k-512x512.py': 64.74e6,
}


def build(cfg):
    """Build the model as the Runner would (scope set, custom_imports done by read_config)."""
    registry = importlib.import_module(f'{cfg.default_scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        return registry.build(cfg.model)


def load(path):
    cfg = read_config(str(path))
    cfg.model.backbone.init_cfg = None  # the tests fetch nothing (tests/test_hub.py serves weights locally)
    return cfg


def fake_batch(scope, num_classes, sizes, with_masks=False):
    """Raw images of odd sizes with targets, in the form the data preprocessor receives."""
    inputs, samples = [], []
    for h, w in sizes:
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8))
        if scope == 'mmdet':
            from mmdet.structures import DetDataSample
            from mmengine.structures import InstanceData
            s = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1., 1.)))
            s.gt_instances = InstanceData(bboxes=torch.tensor([[2., 3., w * .6, h * .7]]),
                                          labels=torch.tensor([num_classes - 1]))
            if with_masks:
                from mmdet.structures.mask import BitmapMasks
                mask = np.zeros((1, h, w), dtype=np.uint8)
                mask[:, 3:int(h * .7), 2:int(w * .6)] = 1
                s.gt_instances.masks = BitmapMasks(mask, h, w)
        else:
            from mmengine.structures import PixelData
            from mmseg.structures import SegDataSample
            s = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
            s.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, h, w)))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def num_classes(cfg):
    if cfg.default_scope == 'mmseg':
        return cfg.model.decode_head.num_classes
    return cfg.model.roi_head.bbox_head.num_classes if 'roi_head' in cfg.model else cfg.model.bbox_head.num_classes


@pytest.mark.parametrize('path', STEPPED, ids=lambda p: p.name)
def test_builds_and_runs_loss_and_predict_at_odd_sizes(path):
    cfg = load(path)
    model = build(cfg)
    model.init_weights()
    model.train()
    masks = 'mask_head' in cfg.model.get('roi_head', {})
    data = model.data_preprocessor(fake_batch(cfg.default_scope, num_classes(cfg), [(97, 131), (75, 61)], masks),
                                   training=True)
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused  # no find_unused_parameters needed
    model.eval()
    data = model.data_preprocessor(fake_batch(cfg.default_scope, num_classes(cfg), [(83, 117)]), training=False)
    with torch.no_grad():
        (pred,) = model(**data, mode='predict')
    if cfg.default_scope == 'mmdet':
        assert pred.pred_instances.bboxes.shape[-1] == 4
        if masks:
            assert tuple(pred.pred_instances.masks.shape[-2:]) == (83, 117)
    else:
        assert tuple(pred.pred_sem_seg.data.shape[-2:]) == (83, 117)


@pytest.mark.parametrize('name', sorted(EXPECTED_PARAMS))
def test_parameter_counts_match_paper(name):
    path = next(p for p in DENSE if p.name == name)
    n = sum(p.numel() for p in build(load(path)).parameters())
    assert abs(n - EXPECTED_PARAMS[name]) / EXPECTED_PARAMS[name] < 0.01


@pytest.mark.parametrize('path', [p for p in DENSE if '-b_' not in p.name and '-l_' not in p.name],
                         ids=lambda p: p.name)   # B and L share S's parameter names
def test_every_custom_key_matches_a_parameter(path):
    """A config's own custom_keys entries each match a parameter; the shared ones (configs/_base_/
    position_no_decay.py, one per registered position encoding, tests/test_weight_decay.py) match exactly the
    parameters the backbone keeps out of weight decay, and nothing of the neck or head."""
    cfg = load(path)
    keys = cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {})
    model = build(cfg)
    names = [n for n, _ in model.named_parameters()]
    shared = cfg.get('position_no_decay', {})
    for key in keys:
        assert key in shared or any(key in n for n in names), f'custom_keys entry {key!r} matches no parameter'
    if shared:
        assert {n for n in names if any(key in n for key in shared)} == \
            {f'backbone.{n}' for n in model.backbone.no_weight_decay()}
    if 'pos_block.' in keys:
        assert any(n.startswith('backbone.pos_block.') for n in names)


# The safe/atomic checkpoint and RNGStateHook opt-ins (importing an adapter only registers the backbones).
OPT_INS = ['cpvt_backbones.adapters.checkpoint', 'cpvt_backbones.adapters.hooks']


@pytest.mark.parametrize('path', [p for p in DENSE if 'shapes' not in str(p)], ids=lambda p: p.name)
def test_paper_configs_follow_the_recipe(path):
    """Each image of an evaluation batch predicted as alone (the valid-size preprocessor and type 'PredictAlone'),
    and the Twins release's settings: RetinaNet and Mask R-CNN 1x (PVT setting: AdamW, wd 1e-4, lr 1e-4 and 2e-4)
    and 3x multi-scale (Swin setting: lr 1e-4, wd 0.05); Semantic FPN 80k (lr 1e-4, wd 1e-4, poly to 0) and
    UperNet 160k (mmseg's: lr 6e-5, wd 0.01, warm-up then linear decay); SVT with masked windows. PVTv2 as mmdet
    ships its RetinaNet (B4 and B5: lr 1e-4 / 1.4, 8 images a batch; drop path 0.1) and as the PVTv2 release
    trained its Semantic FPN (40k iterations, lr 2e-4, 32 images a batch)."""
    cfg = read_config(str(path))
    assert cfg.custom_imports.imports == [f'cpvt_backbones.adapters.{cfg.default_scope}', *OPT_INS]
    assert cfg.custom_hooks == [dict(type='RNGStateHook'), dict(type='NonFiniteLossHook')]
    assert cfg.model.type == 'PredictAlone'
    assert cfg.model.model_type == ('EncoderDecoder' if cfg.default_scope == 'mmseg' else
                                    'MaskRCNN' if 'roi_head' in cfg.model else 'RetinaNet')
    assert cfg.model.data_preprocessor.type == ('ValidSizeDetDataPreprocessor' if cfg.default_scope == 'mmdet' else
                                                'ValidSizeSegDataPreprocessor')
    backbone = cfg.model.backbone
    arch = backbone.arch if isinstance(backbone.arch, str) else backbone.arch.base
    init = backbone.init_cfg
    assert init.type == 'Pretrained' and init.checkpoint == arch  # the published weights' name
    assert backbone.type == ('TwinsSVT' if arch.startswith('svt') else 'PyramidCPVT' if arch.startswith('pcpvt')
                             else 'PVTv2' if arch.startswith('pvt_v2') else 'CPVT')
    pvt_v2 = backbone.type == 'PVTv2'
    big_pvt_v2 = arch in ('pvt_v2_b4', 'pvt_v2_b5')
    if pvt_v2:
        assert backbone.drop_path_rate == 0.1
    if backbone.type == 'TwinsSVT':
        assert backbone.arch.window_mask is True
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW'
    if cfg.default_scope == 'mmdet':
        mask_rcnn = 'roi_head' in cfg.model
        assert cfg.train_dataloader.batch_size * 8 == (8 if big_pvt_v2 else 16) and cfg.model.neck.num_outs == 5
        assert cfg.auto_scale_lr.base_batch_size == cfg.train_dataloader.batch_size * 8
        if not mask_rcnn:   # P3-P7 from strides 8/16/32 + two extra convs on the input (start_level=1 over 4 maps)
            assert cfg.model.neck.add_extra_convs == 'on_input'
            assert len(cfg.model.neck.in_channels) - cfg.model.neck.start_level == 3
        epochs = 36 if '3x' in path.name else 12
        assert cfg.train_cfg.max_epochs == epochs
        assert cfg.param_scheduler[1].milestones == ([27, 33] if epochs == 36 else [8, 11])
        assert opt.weight_decay == (0.05 if '3x' in path.name else 1e-4)
        assert opt.lr == (2e-4 if mask_rcnn and epochs == 12 else 1e-4 / 1.4 if big_pvt_v2 else 1e-4)
        if epochs == 36:
            assert 'norm' in cfg.optim_wrapper.paramwise_cfg.custom_keys
    elif 'upernet' in path.name:
        assert cfg.train_cfg.max_iters == 160000 and opt.lr == 6e-5 and opt.weight_decay == 0.01
        assert cfg.train_dataloader.batch_size * 8 == (32 if 'pcpvt-s' in path.name else 16)
        assert [s.type for s in cfg.param_scheduler] == ['LinearLR', 'PolyLR'] and cfg.param_scheduler[1].power == 1.
        assert cfg.model.auxiliary_head.in_channels == cfg.model.decode_head.in_channels[2]
    else:
        iters = 40000 if pvt_v2 else 80000
        assert cfg.train_dataloader.batch_size * 8 == (32 if pvt_v2 else 16) and cfg.train_cfg.max_iters == iters
        assert opt.lr == (2e-4 if pvt_v2 else 1e-4) and opt.weight_decay == 1e-4
        assert cfg.param_scheduler[0].type == 'PolyLR' and cfg.param_scheduler[0].eta_min == 0
        assert cfg.param_scheduler[0].end == iters
    if cfg.default_scope == 'mmseg':
        assert cfg.crop_size == (512, 512) and cfg.model.decode_head.num_classes == 150


def test_the_docs_first_config_example_opts_in_to_safe_resumable_checkpoints():
    """The config a user copies first (docs/openmmlab.md) imports the checkpoint and hook opt-ins and adds the RNG
    hook: without them its checkpoints can never be resumed bitwise, or loaded safely on every stack."""
    text = (ROOT / 'docs/openmmlab.md').read_text()
    block = text.split('## OpenMMLab', 1)[1].split('```python', 1)[1].split('```', 1)[0]
    cfg = Config.fromstring(block, '.py')
    assert {'cpvt_backbones.adapters.checkpoint', 'cpvt_backbones.adapters.hooks'} <= set(cfg.custom_imports.imports)
    assert dict(type='RNGStateHook') in cfg.custom_hooks


def test_a_base_of_a_module_installed_under_another_distribution_is_found(monkeypatch):
    """As on the OneDL stack (mmseg's modules from ``onedl-mmsegmentation``): a ``mmseg::`` base is found through
    the distribution that provides the module here, whatever mmengine's map names; a mapped module that is not
    importable at all is left as it is; the map is mmengine's own again afterwards."""
    from mmengine.config import utils
    monkeypatch.setitem(utils.MODULE2PACKAGE, 'mmseg', 'not-a-distribution')
    monkeypatch.setitem(utils.MODULE2PACKAGE, 'not_a_module', 'not-a-distribution')
    before = dict(utils.MODULE2PACKAGE)
    cfg = read_config(ROOT / 'configs/sem_fpn/fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py')
    assert cfg.model.decode_head.type == 'FPNHead' and cfg.train_cfg.max_iters == 80000
    assert dict(utils.MODULE2PACKAGE) == before
    monkeypatch.setattr('importlib.metadata.packages_distributions', lambda: {})
    with pytest.raises(ModuleNotFoundError, match='not-a-distribution is not installed'):
        read_config(ROOT / 'configs/sem_fpn/fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py')
