"""Training end to end on a tiny shapes set: loss goes down, two processes on CPU, resume after a kill,
and OpenMMLab's own train/test scripts with our configs."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

for _framework in ('mmengine', 'mmdet', 'mmseg'):
    pytest.importorskip(_framework)
from cpvt_backbones.datasets import ShapesSpec, generate_shapes  # noqa: E402

pytestmark = pytest.mark.heavy
ROOT = Path(__file__).resolve().parents[1]
DET = ROOT / 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py'
SEG = ROOT / 'configs/shapes/fpn_pcpvt-tiny_shapes.py'
QUICK = ['default_hooks.logger.interval=1', 'log_processor.window_size=1', 'param_scheduler.0.start_factor=1.0', 'train_dataloader.batch_size=4']


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
    """A folder holding data/shapes (16 + 4 images): the configs' relative data_root resolves there."""
    root = tmp_path_factory.mktemp('shapes_run')
    generate_shapes(root / 'data' / 'shapes', ShapesSpec(num_train=16, num_val=4, seed=1))
    return root


@pytest.fixture(scope='module')
def overfit_dir(tmp_path_factory):
    """Four training images: every batch of four is the whole set, so the loss curve is not sampling noise."""
    root = tmp_path_factory.mktemp('shapes_overfit')
    generate_shapes(root / 'data' / 'shapes', ShapesSpec(num_train=4, num_val=2, seed=2))
    return root


def run(args, cwd, **kwargs):
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    return subprocess.run([sys.executable] + [str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, **kwargs)


def train(cfg, work_dir, cwd, *extra, max_iters=12, options=()):
    out = run([ROOT / 'tools/train.py', cfg, '--work-dir', work_dir, *extra, '--cfg-options',
               f'train_cfg.max_iters={max_iters}', f'train_cfg.val_interval={max_iters}', *QUICK, *options], cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def losses(work_dir):
    (scalars,) = Path(work_dir).glob('*/vis_data/scalars.json')
    rows = [json.loads(line) for line in scalars.read_text().splitlines()]
    return [r['loss'] for r in rows if 'loss' in r]


@pytest.mark.parametrize('cfg', [DET, SEG], ids=['retinanet', 'sem_fpn'])
def test_shapes_config_trains_and_loss_goes_down(cfg, overfit_dir):
    wd = overfit_dir / f'train_{cfg.stem}'
    train(cfg, wd, overfit_dir, max_iters=30)
    values = losses(wd)  # per iteration (window_size=1)
    assert len(values) == 30 and all(v == v and v < 1e4 for v in values)
    assert sum(values[-5:]) / 5 < 0.6 * sum(values[:5]) / 5, values


def test_two_processes_on_cpu(workdir):
    wd = workdir / 'dist'
    out = run(['-m', 'torch.distributed.run', '--nproc_per_node=2', '--master_port=29531', ROOT / 'tools/train.py',
               DET, '--launcher', 'pytorch', '--work-dir', wd, '--cfg-options', 'train_cfg.max_iters=4',
               'train_cfg.val_interval=4', 'default_hooks.checkpoint.interval=2', *QUICK], workdir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert 'Distributed launcher: pytorch' in log and 'Distributed training: True' in log
    assert 'GPU number: 2' in log  # mmengine's wording for the world size
    values = losses(wd)
    assert len(values) == 4 and all(v == v and v < 1e4 for v in values)
    # Only rank 0 writes: one run folder, one log, the checkpoints once each, and they load.
    runs = [p for p in wd.iterdir() if p.is_dir()]
    assert len(runs) == 1 and len(list(runs[0].glob('*.log'))) == 1
    assert sorted(p.name for p in wd.glob('*.pth')) == ['iter_2.pth', 'iter_4.pth']
    assert (wd / 'last_checkpoint').read_text().strip().endswith('iter_4.pth')
    import torch
    import cpvt_backbones.adapters.mmdet  # noqa: F401  (registers mmengine's log classes as safe)
    ckpt = torch.load(wd / 'iter_4.pth', map_location='cpu')  # default: weights_only=True
    assert ckpt['meta']['iter'] == 4


def test_killed_run_resumes_from_last_checkpoint(workdir):
    wd = workdir / 'resume'
    args = [ROOT / 'tools/train.py', DET, '--work-dir', wd, '--cfg-options', 'train_cfg.max_iters=400',
            'train_cfg.val_interval=400', 'default_hooks.checkpoint.interval=3', *QUICK]
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.Popen([sys.executable] + [str(a) for a in args], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (wd / 'iter_6.pth').exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (wd / 'iter_6.pth').exists()
    time.sleep(1)
    last = int((wd / 'last_checkpoint').read_text().strip().rsplit('_', 1)[1].split('.')[0])
    out = train(DET, wd, workdir, '--resume', max_iters=last + 2)
    log = out.stdout + out.stderr
    assert f'resumed epoch: 0, iter: {last}' in log
    assert (wd / f'iter_{last + 2}.pth').exists()


@pytest.mark.parametrize('cfg, package', [(DET, 'mmdet'), (SEG, 'mmseg')], ids=['mmdet', 'mmseg'])
def test_openmmlab_own_tools_run_our_configs(cfg, package, workdir):
    """The configs work unchanged with the train.py / test.py shipped in the mmdet and mmseg wheels."""
    import importlib
    tools = Path(importlib.import_module(package).__file__).parent / '.mim' / 'tools'
    wd = workdir / f'own_{package}'
    out = run([tools / 'train.py', cfg, '--work-dir', wd, '--cfg-options', 'train_cfg.max_iters=2',
               'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2', *QUICK], workdir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # Score threshold 0 so that a two-iteration detector still returns boxes and COCO eval prints its mAP.
    keep_all = ['--cfg-options', 'model.test_cfg.score_thr=0.0'] if package == 'mmdet' else []
    out = run([tools / 'test.py', cfg, wd / 'iter_2.pth', '--work-dir', wd, *keep_all], workdir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert ('bbox_mAP' if package == 'mmdet' else 'mIoU') in out.stdout + out.stderr


@pytest.mark.parametrize('cfg, package', [(DET, 'mmdet'), (SEG, 'mmseg')], ids=['mmdet', 'mmseg'])
def test_infer_on_a_folder_at_any_resolution(cfg, package, workdir):
    wd = workdir / f'infer_{package}'
    train(cfg, wd, workdir, max_iters=1, options=['default_hooks.checkpoint.interval=1'])
    images = workdir / 'data' / 'shapes' / 'val' / 'images'
    for mode in (['--native'], ['--scale', '173', '97']):
        out = workdir / f'infer_out_{package}_{mode[0][2:]}'
        res = run([ROOT / 'tools/infer.py', cfg, wd / 'iter_1.pth', images, '--out-dir', out, *mode], workdir)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        vis = sorted(p.name for p in (out / 'vis').iterdir())
        preds = sorted(p.name for p in (out / 'preds').iterdir())
        assert len(vis) == 4 and len(preds) == 4, (vis, preds)
