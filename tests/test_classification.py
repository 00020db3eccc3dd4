"""The classification pipeline on the embedded shape crops: configs train, test sizes are what they say, the
resolution sweep writes its table and plot."""
import json
from pathlib import Path

import pytest
import torch
from tool_server import run_tool

pytest.importorskip('mmpretrain')
from mmengine.registry import DefaultScope  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from cpvt_backbones.adapters.evaluation import set_cls_test_size  # noqa: E402
from cpvt_backbones.adapters.runner import read_config  # noqa: E402
from cpvt_backbones.datasets import generate_shape_crops  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLS_CONFIGS = ['pcpvt-tiny_shapes-cls.py', 'cpvt-tiny-gap_shapes-cls.py']


@pytest.fixture(scope='module')
def crops(tmp_path_factory):
    root = tmp_path_factory.mktemp('crops')
    generate_shape_crops(root / 'shapes_cls', num_train=8, num_val=4, size=48)
    return root / 'shapes_cls'


def shapes_cfg(name, data_root, work_dir, iters):
    cfg = read_config(str(ROOT / 'configs/shapes' / name))
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = str(data_root)
    cfg.test_dataloader = cfg.val_dataloader
    cfg.train_dataloader.batch_size = 8
    cfg.train_cfg.max_iters = cfg.train_cfg.val_interval = iters
    cfg.default_hooks.checkpoint.interval = iters
    cfg.default_hooks.logger.interval = 1
    cfg.log_processor.window_size = 1
    cfg.param_scheduler[0].start_factor = 1.0  # no warm-up: a short run must learn
    cfg.work_dir = str(work_dir)
    return cfg


@pytest.mark.heavy
@pytest.mark.parametrize('name', CLS_CONFIGS)
def test_shapes_classifier_learns_the_training_crops(name, crops, tmp_path):
    cfg = shapes_cfg(name, crops, tmp_path / 'work', iters=30)
    runner = Runner.from_cfg(cfg)
    runner.train()
    (scalars,) = (tmp_path / 'work').glob('*/vis_data/scalars.json')
    losses = [json.loads(line)['loss'] for line in scalars.read_text().splitlines() if 'loss' in line]
    assert len(losses) == 30 and sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses
    assert 0 <= runner.val()['accuracy/top1'] <= 100


@pytest.mark.parametrize('size, crop_ratio, resize_to', [(56, None, 56), (224, 0.875, 256), (97, 0.875, 111)])
def test_classification_test_size_is_applied(crops, tmp_path, size, crop_ratio, resize_to):
    cfg = shapes_cfg('cpvt-tiny-gap_shapes-cls.py', crops, tmp_path, iters=1)
    set_cls_test_size(cfg, size, crop_ratio)
    steps = cfg.test_dataloader.dataset.pipeline
    assert [s['type'] for s in steps] == ['LoadImageFromFile', 'ResizeEdge', 'CenterCrop', 'PackInputs']
    assert steps[1]['scale'] == resize_to and steps[2]['crop_size'] == size
    from mmpretrain.registry import DATASETS
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        dataset = DATASETS.build(cfg.test_dataloader.dataset)
    assert tuple(dataset[0]['inputs'].shape) == (3, size, size)


@pytest.mark.heavy
def test_eval_sizes_writes_table_and_plot(crops, tmp_path):
    cfg = shapes_cfg('cpvt-tiny-gap_shapes-cls.py', crops, tmp_path / 'work', iters=2)
    Runner.from_cfg(cfg).train()
    cfg_file = tmp_path / 'cls.py'
    cfg.dump(str(cfg_file))
    out = run_tool([ROOT / 'tools/eval_sizes.py', cfg_file, tmp_path / 'work' / 'iter_2.pth', '--sizes', '48',
                    '72', '111', '--out', tmp_path / 'sweep', '--name', 'tiny'])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / 'sweep' / 'tiny.json').read_text())
    assert result['metric'] == 'accuracy/top1'
    assert [r['size'] for r in result['rows']] == [48, 72, 111]
    assert all(0 <= r['metric'] <= 100 for r in result['rows'])
    assert (tmp_path / 'sweep' / 'tiny.csv').read_text().splitlines()[0] == 'size,metric'
    assert (tmp_path / 'sweep' / 'tiny.png').read_bytes()[:4] == b'\x89PNG'


def test_pos_embed_baseline_is_honoured():
    """The DeiT-style baseline of the study: a learned table resized to the token grid, frozen with the
    stem, excluded from weight decay; without a table and without PEGs the model is blind to position."""
    from cpvt_backbones import create_model
    table = dict(type='learned', img_size=64)
    ape = create_model('cpvt_tiny_gap', pos_encoding=table, frozen_stages=0)
    assert ape.pos_embed.table(0).shape == (1, 16, 192) and not ape.pos_embed.table(0).requires_grad
    assert 'pos_embed.0' in ape.no_weight_decay()
    ape.eval()
    with torch.no_grad():
        ape.pos_embed.table(0).normal_(std=1.0)
        assert ape(torch.randn(2, 3, 97, 131)).shape == (2, 1000)  # 7 x 9 grid from a 4 x 4 table
        blind = create_model('cpvt_tiny_gap', pos_encoding='none').eval()
        x = torch.randn(1, 3, 64, 64)
        shuffled = x.reshape(1, 3, 4, 16, 4, 16).flip(2).reshape(1, 3, 64, 64)  # patches rows reversed
        assert torch.allclose(blind(x), blind(shuffled), atol=1e-5)
        ape_cls = create_model('cpvt_tiny', pos_encoding=table).eval()
        ape_cls.pos_embed.table(0).normal_(std=1.0)
        assert not torch.allclose(ape_cls(x), ape_cls(shuffled), atol=1e-3)
    with pytest.raises(ValueError, match='img_size'):
        create_model('cpvt_tiny', pos_encoding=dict(type='learned', img_size=(4,)))
