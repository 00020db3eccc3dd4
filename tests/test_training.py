"""Training end to end on a tiny shapes set: loss goes down, two processes on CPU (and the same curve as one),
bitwise resume after a kill, and OpenMMLab's own train/test scripts with our configs."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

for _framework in ('mmengine', 'mmdet', 'mmseg'):
    pytest.importorskip(_framework)
from tool_server import run_tool  # noqa: E402
from torch_features import needs_torch  # noqa: E402

from cpvt_backbones.datasets import ShapesSpec, generate_shapes  # noqa: E402

pytestmark = pytest.mark.heavy
ROOT = Path(__file__).resolve().parents[1]
DET = ROOT / 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py'
SEG = ROOT / 'configs/shapes/fpn_pcpvt-tiny_shapes.py'
# Mask R-CNN and UperNet on the shapes data: built on DET's and SEG's configs (their data, schedule, backbone).
MASK = ROOT / 'configs/shapes/mask-rcnn_pcpvt-tiny_fpn_shapes.py'
UPER = ROOT / 'configs/shapes/upernet_pcpvt-tiny_shapes.py'
QUICK = ['default_hooks.logger.interval=1', 'log_processor.window_size=1', 'param_scheduler.0.start_factor=1.0',
         'train_dataloader.batch_size=4']


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


def run(args, cwd, env_extra=None, timeout=None):
    """``python ARGS`` in ``cwd`` (one OpenMP thread, ``env_extra`` added): a fork of the tool server
    (``tool_server``), or a new interpreter for the ranks of ``-m torch.distributed.run``."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1', **(env_extra or {}))
    args = [str(a) for a in args]
    if args[:2] == ['-m', 'torch.distributed.run']:
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    return run_tool(args, cwd, env, timeout)


def train(cfg, work_dir, cwd, *extra, max_iters=12, options=()):
    out = run([ROOT / 'tools/train.py', cfg, '--work-dir', work_dir, *extra, '--cfg-options',
               f'train_cfg.max_iters={max_iters}', f'train_cfg.val_interval={max_iters}', *QUICK, *options], cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope='module')
def trained(workdir):
    """``trained(cfg)``: the checkpoint of a two-iteration tools/train.py run of ``cfg`` on ``workdir``'s data,
    trained on the first request and shared by the tests that need trained weights of the config (inference,
    calibration, the OpenVINO engine). Under pytest-xdist those tests share a group (``on_one_worker``), so that
    one worker trains each config once."""
    checkpoints = {}

    def checkpoint(cfg):
        if cfg not in checkpoints:
            wd = workdir / f'trained_{cfg.stem}'
            train(cfg, wd, workdir, max_iters=2, options=['default_hooks.checkpoint.interval=2'])
            checkpoints[cfg] = wd / 'iter_2.pth'
        return checkpoints[cfg]
    return checkpoint


def on_one_worker(cfg):
    """The pytest-xdist group of the tests that use ``trained(cfg)`` (run with ``--dist loadgroup``)."""
    return pytest.mark.xdist_group(f'trained_{cfg.stem}')


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


def test_training_stops_at_the_first_non_finite_loss_and_keeps_the_finite_checkpoints(overfit_dir):
    """lr 1000: the loss turns NaN within a few iterations; the run exits non-zero naming the iteration, and every
    checkpoint it wrote (one per iteration, the last two kept) holds finite weights."""
    import torch
    wd = overfit_dir / 'nonfinite'
    out = run([ROOT / 'tools/train.py', SEG, '--work-dir', wd, '--cfg-options', 'train_cfg.max_iters=30',
               'train_cfg.val_interval=30', 'optim_wrapper.optimizer.lr=1000', 'optim_wrapper.clip_grad=None',
               'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=2', *QUICK],
              overfit_dir)
    text = out.stdout + out.stderr
    found = re.search(r'(non-finite loss|refusing to save a checkpoint) at iteration (\d+)', text)
    assert out.returncode != 0 and found, text[-3000:]
    stopped = int(found.group(2))
    kept = sorted(wd.glob('iter_*.pth'))
    assert kept and all(int(p.stem.split('_')[1]) < stopped for p in kept)
    for path in kept:
        state = load_checkpoint(path)['state_dict']
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), path


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
    assert load_checkpoint(wd / 'iter_4.pth')['meta']['iter'] == 4


def load_checkpoint(path):
    """The package's safe loader (the checkpoint opt-in allows mmengine's log classes)."""
    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (mmengine's log buffers load safely)
    from cpvt_backbones.convert import safe_load
    return safe_load(path)


def final_weights(path):
    ckpt = load_checkpoint(path)
    return ckpt['state_dict'], ckpt['optimizer']['state']


def test_killed_run_resumes_to_the_same_weights(workdir):
    """SIGKILL after a checkpoint, ``--resume``: training continues from it and, with fixed seeds and one
    thread, ends with bitwise the same weights and optimizer state as a run that was never interrupted (the
    dataloader replays its draws to the resumed iteration; drop path is on, so the torch RNG state saved in
    the checkpoint must be restored too)."""
    import torch
    total = 12
    options = ['default_hooks.checkpoint.interval=3', 'model.backbone.drop_path_rate=0.1']
    straight = workdir / 'straight'
    train(DET, straight, workdir, max_iters=total, options=options)

    wd = workdir / 'resume'
    args = [ROOT / 'tools/train.py', DET, '--work-dir', wd, '--cfg-options', f'train_cfg.max_iters={total}',
            f'train_cfg.val_interval={total}', *QUICK, *options]
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.Popen([sys.executable] + [str(a) for a in args], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def last_saved():
        # mmengine writes iter_N.pth first and then `last_checkpoint` (plain open/write, so it can be read
        # empty): only a complete marker says N is resumable.
        marker = wd / 'last_checkpoint'
        name = marker.read_text().strip() if marker.exists() else ''
        return int(name.rsplit('_', 1)[1].split('.')[0]) if name.endswith('.pth') else 0

    deadline = time.time() + 300
    while last_saved() < 6 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (wd / f'iter_{total}.pth').exists(), 'the run ended before it could be killed'
    last = last_saved()
    assert last >= 6
    out = train(DET, wd, workdir, '--resume', max_iters=total, options=options)
    assert f'resumed epoch: 0, iter: {last}' in out.stdout + out.stderr
    weights, optim = final_weights(wd / f'iter_{total}.pth')
    ref_weights, ref_optim = final_weights(straight / f'iter_{total}.pth')
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights), 'weights differ after resume'
    assert all(torch.equal(optim[i]['exp_avg'], ref_optim[i]['exp_avg']) for i in optim)


# Per-iteration relative tolerance between one process and two: the gradients are the same sums taken in
# another order (each rank's mean, then gloo's average), so they agree to float32 rounding (~1e-7); AdamW
# and gradient clipping carry that into the weights, and the loss moves by far less than 1e-4.
DIST_REL_TOL = 1e-4


def test_two_processes_give_the_loss_curve_of_one(workdir):
    """Same global batch of 4: one process, and two processes with 2 images each. The pipeline is made
    deterministic (fixed resize, no flip; each rank would otherwise draw the same augmentation numbers for
    different images), BatchNorm becomes GroupNorm (per-process batch statistics differ by design), drop path
    stays 0, so the two runs compute the same function and must follow the same curve."""
    cfg = workdir / 'seg_dist_equivalence.py'
    cfg.write_text(f"""_base_ = '{SEG}'
custom_imports = dict(imports=['cpvt_backbones.adapters.mmseg', 'global_loss_hook'], allow_failed_imports=False)
model = dict(decode_head=dict(norm_cfg=dict(type='GN', num_groups=8, requires_grad=True)))
train_dataloader = dict(dataset=dict(pipeline=[
    dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
    dict(type='Resize', scale=(96, 128), keep_ratio=False), dict(type='PackSegInputs')]))
custom_hooks = [dict(type='GlobalLossRecorder')]
""")
    iters = 6
    common = ['--cfg-options', f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
              f'default_hooks.checkpoint.interval={iters}', 'param_scheduler.0.start_factor=1.0']
    env = dict(PYTHONPATH=str(ROOT / 'tests'))
    curves = {}
    for nproc, batch in ((1, 4), (2, 2)):
        wd = workdir / f'equiv_{nproc}'
        launch = (['-m', 'torch.distributed.run', f'--nproc_per_node={nproc}', '--master_port=29533']
                  if nproc > 1 else [])
        out = run([*launch, ROOT / 'tools/train.py', cfg, '--work-dir', wd,
                   *(['--launcher', 'pytorch'] if nproc > 1 else []), *common,
                   f'train_dataloader.batch_size={batch}'], workdir, env_extra=env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        rows = [json.loads(line) for line in (wd / 'global_loss.jsonl').read_text().splitlines()]
        curves[nproc] = [r['loss'] for r in rows]
    one, two = curves[1], curves[2]
    assert len(one) == len(two) == iters
    assert one[-1] < one[0]  # it trains
    rel = [abs(a - b) / abs(a) for a, b in zip(one, two, strict=False)]
    assert max(rel) < DIST_REL_TOL, (one, two, rel)


@pytest.mark.parametrize('cfg, package', [(MASK, 'mmdet'), (UPER, 'mmseg')], ids=['mmdet', 'mmseg'])
def test_openmmlab_own_tools_run_our_configs(cfg, package, workdir):
    """The configs work unchanged with the train.py / test.py shipped in the mmdet and mmseg wheels: Mask R-CNN
    (boxes and instance masks, segm mAP) and UperNet, whose configs extend RetinaNet's and Semantic FPN's. Where the
    framework's own mmengine cannot resolve the config's `mmseg::` bases at all (onedl-mmengine 0.10.12 looks
    for a distribution named mmsegmentation, which the OneDL stack installs as onedl-mmsegmentation: every
    `mmseg::` config fails there, OneDL's own included), the test holds that failure to its cause and our
    tools/train.py (which resolves the bases through adapters.runner.read_config) trains the config instead."""
    import importlib
    import importlib.metadata

    from mmengine.config import utils
    tools = Path(importlib.import_module(package).__file__).parent / '.mim' / 'tools'
    wd = workdir / f'own_{package}'
    train_args = ['--work-dir', wd, '--cfg-options', 'train_cfg.max_iters=2', 'train_cfg.val_interval=2',
                  'default_hooks.checkpoint.interval=2', *QUICK]
    out = run([tools / 'train.py', cfg, *train_args], workdir)
    distributions = {d.metadata['Name'].lower() for d in importlib.metadata.distributions()}
    if package == 'mmseg' and utils.MODULE2PACKAGE['mmseg'] not in distributions:
        assert out.returncode != 0 and f"{utils.MODULE2PACKAGE['mmseg']} is not installed" in out.stderr, \
            out.stdout[-3000:] + out.stderr[-3000:]
        tools = ROOT / 'tools'
        out = run([tools / 'train.py', cfg, *train_args], workdir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # Score threshold 0 so that a two-iteration detector still returns boxes and COCO eval prints its mAP.
    keep_all = ['--cfg-options', 'model.test_cfg.rcnn.score_thr=0.0'] if package == 'mmdet' else []
    out = run([tools / 'test.py', cfg, wd / 'iter_2.pth', '--work-dir', wd, *keep_all], workdir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for metric in (['coco/bbox_mAP', 'coco/segm_mAP'] if package == 'mmdet' else ['mIoU']):
        assert metric in out.stdout + out.stderr, metric


SHARED_CHECKPOINT = [pytest.param(DET, 'mmdet', id='mmdet', marks=on_one_worker(DET)),
                     pytest.param(SEG, 'mmseg', id='mmseg', marks=on_one_worker(SEG))]


@pytest.mark.parametrize('cfg, package', SHARED_CHECKPOINT)
def test_infer_on_a_folder_at_any_resolution(cfg, package, workdir, trained):
    checkpoint = trained(cfg)
    images = workdir / 'data' / 'shapes' / 'val' / 'images'
    for mode in (['--native'], ['--scale', '173', '97']):
        out = workdir / f'infer_out_{package}_{mode[0][2:]}'
        res = run([ROOT / 'tools/infer.py', cfg, checkpoint, images, '--out-dir', out, *mode], workdir)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        vis = sorted(p.name for p in (out / 'vis').iterdir())
        preds = sorted(p.name for p in (out / 'preds').iterdir())
        assert len(vis) == 4 and len(preds) == 4, (vis, preds)
    # Every size the backbones take: predictions for all; an image the visualiser cannot draw gets one line.
    odd = workdir / f'odd_{package}'
    odd.mkdir(exist_ok=True)
    sizes = [(1, 1), (9, 13), (37, 523), (700, 95)]
    for w, h in sizes:
        Image.fromarray(np.random.default_rng(w).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(odd / f'{w}x{h}.png')
    out = workdir / f'infer_out_{package}_odd'
    res = run([ROOT / 'tools/infer.py', cfg, checkpoint, odd, '--out-dir', out, '--native'], workdir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    preds = sorted(p.stem for p in (out / 'preds').iterdir())
    assert preds == sorted(f'{w}x{h}' for w, h in sizes), preds
    drawn = {p.stem for p in (out / 'vis').iterdir()}
    not_drawn = [line for line in res.stdout.splitlines() if 'not drawn' in line]
    assert len(drawn) + len(not_drawn) == len(sizes) and {'9x13', '37x523', '700x95'} <= drawn, (drawn, not_drawn)
    assert all(line.startswith('[infer] 1x1.png: not drawn (') for line in not_drawn), not_drawn


def engine_files(line: str) -> list[str]:
    """The files an ``[engine]`` line names: those it saved, then those it loaded (each in the order printed)."""
    parts = dict(part.partition(': ')[::2] for part in line.split('; ')[1:])
    return [p for kind in ('saved', 'loaded') if parts.get(kind) for p in parts[kind].split(', ')]


@needs_torch('int8_kernel')
@on_one_worker(SEG)
def test_static_int8_is_calibrated_once_and_reused(workdir, trained, tmp_path):
    """tools/test.py --precision int8 --calibrate (the fused engine, the default): activation ranges of every
    linear layer of the backbone from a few images (a folder, or the config's test set), saved under the weights
    directory and reused by the next run instead of calibrating again; --calibrate without int8 is refused."""
    checkpoint, wd = trained(SEG), workdir / 'calibrate_mmseg'
    env = dict(CPVT_WEIGHTS_DIR=str(tmp_path))
    runs = {}
    for source in (workdir / 'data' / 'shapes' / 'train' / 'images', 'val', 'val'):
        res = run([ROOT / 'tools/test.py', SEG, checkpoint, '--work-dir', wd, '--precision', 'int8',
                   '--calibrate', source, '--calibrate-images', '3'], workdir, env)
        assert res.returncode == 0 and 'mIoU' in res.stdout + res.stderr, res.stdout[-3000:] + res.stderr[-3000:]
        (line,) = [x for x in res.stdout.splitlines() if x.startswith('[engine] ')]
        (path,) = [Path(p) for p in engine_files(line) if p.endswith('.ranges.json')]
        runs.setdefault(str(source), []).append((path, path.stat().st_mtime_ns))
    (folder,), (val_first, val_again) = [v for k, v in runs.items() if k != 'val'], runs['val']
    assert folder[0] != val_first[0] and val_first == val_again  # same file, not written again
    ranges = json.loads(val_first[0].read_text())
    calibrated = json.loads(Path(f'{val_first[0]}.record.json').read_text())['calibration']
    from torch import nn

    from cpvt_backbones import create_model
    linears = {n for n, m in create_model('pcpvt_tiny', features_only=True).named_modules()
               if isinstance(m, nn.Linear)}
    assert calibrated['source'] == 'val' and calibrated['images'] == 3 and set(ranges) == linears
    assert all(low < high for low, high in ranges.values())
    res = run([ROOT / 'tools/test.py', SEG, checkpoint, '--calibrate', 'val'], workdir, env)
    assert res.returncode != 0 and "calibration and keep_fp32 configure the calibrated precisions of engine 'fused'" \
        in res.stderr


@needs_torch('int8_kernel')
@on_one_worker(SEG)
def test_calibrate_writes_the_fused_ranges_once_for_a_request_to_read(workdir, trained, tmp_path, monkeypatch):
    """``adapters.engines.calibrate`` (what ``make demo --precisions int8`` fixes its ranges with): the fused
    engine's ranges artifact of the config's model on a folder's images, with a record of that calibration, read
    back unchanged by the next call; a request at int8 takes the file as its ``input_ranges``, and a config whose
    backbone is not ours or a missing checkpoint is refused."""
    from torch import nn

    from cpvt_backbones import create_model
    from cpvt_backbones.adapters.engines import calibrate, config_request
    from cpvt_backbones.adapters.runner import load_config
    checkpoint, folder = trained(SEG), workdir / 'data' / 'shapes' / 'train' / 'images'
    monkeypatch.chdir(workdir)
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(tmp_path))
    cfg = load_config(str(SEG))
    path = calibrate(cfg, str(checkpoint), str(folder), 2)
    written = path.stat().st_mtime_ns
    assert path.name.endswith('.ranges.json') and path.is_relative_to(tmp_path / 'fused')
    ranges = json.loads(path.read_text())
    linears = {n for n, m in create_model('pcpvt_tiny', features_only=True).named_modules() if isinstance(m, nn.Linear)}
    assert set(ranges) == linears and all(low < high for low, high in ranges.values())
    calibration = json.loads(Path(f'{path}.record.json').read_text())['calibration']
    assert calibration['source'] == str(folder.resolve()) and calibration['images'] == 2, calibration
    assert calibrate(cfg, str(checkpoint), str(folder), 2) == path and path.stat().st_mtime_ns == written
    assert config_request(cfg, 'fused', 'int8', input_ranges=str(path)).options['input_ranges'] == str(path)
    with pytest.raises(FileNotFoundError, match='no checkpoint file'):
        calibrate(cfg, str(tmp_path / 'missing.pth'), str(folder), 2)


@needs_torch('export')
@pytest.mark.parametrize('cfg, package', SHARED_CHECKPOINT)
def test_openvino_engine_gives_torchs_metrics_and_predictions(cfg, package, workdir, trained, tmp_path):
    """tools/test.py --engine openvino: the config's test loop with backbone, neck and head on OpenVINO gives
    torch's metrics (float32) and runs int8 (NNCF on the test set); tools/infer.py --engine openvino writes
    torch's predictions. On the segmentor only (these do not depend on the task; the detector's bf16 outputs are
    checked in test_autocast.py): the torch engine's bf16 (autocast) is close, int8 is calibrated once and the
    quantized model reused. On the detector, int8 with --keep-fp32 leaves the neck in float32 (the segmentor's int8
    keeps the config's choice)."""
    pytest.importorskip('openvino', reason="engine 'openvino' needs openvino (not on the upstream and core stacks)")
    checkpoint, wd = trained(cfg), workdir / f'openvino_{package}'
    env = dict(CPVT_WEIGHTS_DIR=str(tmp_path))
    keep_all = ['--cfg-options', 'model.test_cfg.score_thr=0.0'] if package == 'mmdet' else []
    metric = re.compile(r'(coco/bbox_mAP|mIoU): (\d+\.\d+)' if package == 'mmdet' else r'(mIoU): (\d+\.\d+)')
    scores, saved = {}, []
    int8 = ['--engine', 'openvino', '--precision', 'int8', '--calibrate-images', '4']
    if package == 'mmseg':
        engines = [['--engine', 'torch'], ['--engine', 'openvino'], int8, ['--engine', 'torch', '--precision', 'bf16'],
                   int8]
    else:
        engines = [['--engine', 'torch'], ['--engine', 'openvino'], [*int8, '--keep-fp32', 'neck']]
    for engine in engines:
        res = run([ROOT / 'tools/test.py', cfg, checkpoint, '--work-dir', wd, *engine, *keep_all], workdir, env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        if '--keep-fp32' in engine:
            assert 'on openvino at int8, float32: neck;' in res.stdout, res.stdout[-3000:]
        scores.setdefault(' '.join(engine), []).append(float(metric.findall(res.stdout + res.stderr)[-1][1]))
        saved += [[p for p in engine_files(line) if p.endswith('.xml')][0]
                  for line in res.stdout.splitlines() if line.startswith('[engine]') and 'on openvino' in line]
    assert scores['--engine openvino'] == scores['--engine torch'], scores
    assert Path(saved[1]).is_file() and Path(saved[1]).with_suffix('.bin').is_file() and saved[0] != saved[1]
    if package == 'mmseg':
        # bf16 autocast of backbone, neck and head: the mIoU (printed in percent) within 1 point of float32
        bf16, = scores['--engine torch --precision bf16']
        assert abs(bf16 - scores['--engine torch'][0]) <= 1.0, scores
        first, again = scores[' '.join(int8)]
        assert first == again, 'the saved int8 model gives the same metrics'
        assert len(saved) == 3 and saved[1] == saved[2], saved

    images = workdir / 'data' / 'shapes' / 'val' / 'images'
    preds = {}
    for engine in ('torch', 'openvino'):
        out = tmp_path / f'infer_{engine}'
        res = run([ROOT / 'tools/infer.py', cfg, checkpoint, images, '--out-dir', out, '--native',
                   '--engine', engine, '--precision=fp32'], workdir, env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert len(list((out / 'vis').iterdir())) == 4
        preds[engine] = sorted((out / 'preds').iterdir())
    for a, b in zip(preds['torch'], preds['openvino'], strict=False):
        assert a.name == b.name
        if a.suffix == '.json':
            pa, pb = json.loads(a.read_text()), json.loads(b.read_text())
            assert pa['labels'] == pb['labels'] and np.allclose(pa['bboxes'], pb['bboxes'], atol=1e-2)
            assert np.allclose(pa['scores'], pb['scores'], atol=1e-4)
        else:
            assert (np.asarray(Image.open(a)) == np.asarray(Image.open(b))).mean() > 0.999
