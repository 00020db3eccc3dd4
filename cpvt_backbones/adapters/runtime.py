"""What our train/test tools add to mmengine's Runner: config overrides, resume, AMP, CPU multi-process."""
import contextlib
import gc
import logging
import os
import warnings
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist
from mmengine.config import Config, DictAction

from ..utils import atomic_write

__all__ = ['KNOWN_LOG_LINES', 'KNOWN_WARNINGS', 'METRICS', 'SHAPES_TASKS', 'DictAction', 'Metric', 'ShapesTask',
           'add_common_args', 'build_runner', 'enable_amp', 'headline_score', 'launched', 'load_config',
           'prepare_launch', 'quiet_known_warnings', 'runner_checkpoint', 'set_cls_test_size', 'set_test_scale']
_CLS_RESIZE_STEPS = ('Resize', 'ResizeEdge', 'RandomResize', 'CenterCrop', 'RandomResizedCrop')


class Metric(NamedTuple):
    key: str        # in the metrics the framework's test loop returns
    label: str
    scale: float    # to a percentage


# The headline score of each framework's test loop.
METRICS = {'mmpretrain': Metric('accuracy/top1', 'top-1 accuracy (%)', 1.),
           'mmdet': Metric('coco/bbox_mAP', 'bbox mAP (x100)', 100.),
           'mmseg': Metric('mIoU', 'mIoU (%)', 1.)}


class ShapesTask(NamedTuple):
    scope: str
    config: str     # relative to the repository root


# The CPU-sized tasks on the generated shapes data (the demo, the dense study).
SHAPES_TASKS = {'detection': ShapesTask('mmdet', 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py'),
                'segmentation': ShapesTask('mmseg', 'configs/shapes/fpn_pcpvt-tiny_shapes.py')}


# Warnings mmengine, mmdet and mmseg print on every model or inferencer they build (about 40 blocks in one demo
# run), none about anything our tools or configs could change.
KNOWN_WARNINGS = (
    r'Failed to add <class .mmengine\.visualization\.vis_backend\.LocalVisBackend',  # inferencers without save_dir
    r'Default ``avg_non_ignore`` is False',                       # mmseg's CrossEntropyLoss default
    r'``build_loss`` would be deprecated soon',                   # mmseg's own heads
    r'The draw is False, it means that the hook for visualization',  # mmseg's hook, drawing off by default
    r'<class .*> instance named of visualizer has been created',   # every Runner after the first in a process
)
# Log lines of mmengine's Runner that repeat in every run: the optimizer constructor's three lines per parameter
# under a paramwise_cfg (hundreds per run), its file-backend deprecation notices, mmseg's IoUMetric
# built without a prefix (once per evaluation), and the scope fallback for a dataloader's collate function.
KNOWN_LOG_LINES = ('paramwise_options -- ', '"FileClient" will be deprecated', '"HardDiskBackend" is the alias',
                   'The prefix is not set in metric class',
                   'registry tree. As a workaround, the current "function" registry')


def quiet_known_warnings() -> None:
    """Hide ``KNOWN_WARNINGS`` (our tools call this first); every other warning, ours included, still shows."""
    for message in KNOWN_WARNINGS:
        warnings.filterwarnings('ignore', message=message, category=UserWarning)


class _DropKnownLogLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(line in message for line in KNOWN_LOG_LINES)


def build_runner(cfg: Config):
    """mmengine's Runner for ``cfg``, its logger without ``KNOWN_LOG_LINES`` (every other line still shows)."""
    from mmengine.runner import Runner
    runner = Runner.from_cfg(cfg)
    runner.logger.addFilter(_DropKnownLogLines())
    return runner


def headline_score(scope: str, metrics: Mapping[str, float]) -> float:
    """The framework's headline score as a percentage; 0 where the metric is missing (mmdet's CocoMetric reports
    nothing when no box passes the score threshold)."""
    metric = METRICS[scope]
    return metric.scale * float(metrics.get(metric.key, 0.))


def load_config(path: str, cfg_options: Optional[dict] = None, work_dir: Optional[str] = None) -> Config:
    """Read a config, apply ``--cfg-options`` and choose ``work_dirs/<config name>`` unless given."""
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = str(Path('work_dirs') / Path(path).stem)
    return cfg


def enable_amp(cfg: Config) -> None:
    """Mixed precision through mmengine's AmpOptimWrapper: fp16 with dynamic loss scaling on a GPU. mmengine
    0.10.7 supports it only on CUDA/NPU/MLU, so on a CPU-only machine this is an error, not a silent no-op."""
    if not torch.cuda.is_available():
        raise SystemExit('--amp needs a GPU: mmengine 0.10.7 runs AmpOptimWrapper only on CUDA/NPU/MLU devices')
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')


def prepare_launch(cfg: Config, launcher: str) -> None:
    """Set the launcher; without a GPU, make multi-process training work on CPU.

    mmengine's own set-up calls ``torch.cuda.set_device`` and wraps the model in DDP with
    ``device_ids=[LOCAL_RANK]``, both of which fail on CPU. Here the process group is started with gloo
    before the Runner is built (so mmengine skips its own init) and DDP gets ``device_ids=None``.
    """
    cfg.launcher = launcher
    if launcher == 'none' or torch.cuda.is_available():
        return
    if launcher != 'pytorch':
        raise SystemExit(f'launcher {launcher!r} needs GPUs here; on CPU use torchrun (--launcher pytorch)')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    wrapper.setdefault('type', 'MMDistributedDataParallel')
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                                world_size=int(os.environ['WORLD_SIZE']))


@contextlib.contextmanager
def launched(cfg: Config, launcher: str):
    """``prepare_launch``, and on the way out an orderly end of the process group: the ranks meet at a
    barrier, then each destroys its group. A gloo group left to the interpreter's exit is torn down while its
    peers may already be gone, or while the interpreter itself is being finalised, which aborts a rank now and
    then ("terminate called without an active exception") after all the work is done. The runner's DDP
    wrapper holds the group too, and the runner lives in reference cycles (its loops point back at it), so it
    is collected first. (After an error there is no barrier: a peer may never come.)"""
    prepare_launch(cfg, launcher)
    try:
        yield
        if dist.is_initialized():
            gc.collect()
            dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def add_common_args(parser, launchers: Sequence[str] = ('none', 'pytorch', 'slurm', 'mpi')) -> None:
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries: key=value')
    parser.add_argument('--launcher', choices=launchers, default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def set_test_scale(cfg: Config, scale: Optional[Sequence[int]], keep_ratio: bool = True) -> None:
    """Make the test pipeline resize to ``scale`` (W, H), or, with ``scale=None``, keep each image's own size
    (a resize by 1.0, which records the scale factor that mmdet's post-processing expects)."""
    for dataset in _test_pipelines(cfg):
        steps = [s for s in dataset.pipeline if s['type'] not in ('Resize', 'RandomResize')]
        resize = dict(scale_factor=1.0) if scale is None else dict(scale=tuple(scale))
        steps.insert(1, dict(type='Resize', keep_ratio=keep_ratio, **resize))
        dataset.pipeline = steps


def _test_pipelines(cfg: Config):
    for loader in ('test_dataloader', 'val_dataloader'):
        if cfg.get(loader) is None:
            continue
        dataset = cfg[loader].dataset
        while 'pipeline' not in dataset:
            dataset = dataset.dataset
        yield dataset


def set_cls_test_size(cfg: Config, size: int, crop_ratio: Optional[float] = None) -> None:
    """Classification at ``size`` x ``size`` without fine-tuning: resize the short side to ``size / crop_ratio``
    (bicubic) and centre-crop ``size``, the crop ratio kept from training (the config's ``crop_ratio``: 0.875
    for ImageNet, i.e. 256 -> 224; 1 when whole images are used)."""
    ratio = cfg.get('crop_ratio', 1.0) if crop_ratio is None else crop_ratio
    for dataset in _test_pipelines(cfg):
        steps = [s for s in dataset.pipeline if s['type'] not in _CLS_RESIZE_STEPS]
        steps[1:1] = [dict(type='ResizeEdge', scale=round(size / ratio), edge='short', backend='pillow',
                           interpolation='bicubic'), dict(type='CenterCrop', crop_size=size)]
        dataset.pipeline = steps


def _our_backbone(cfg: Config) -> Optional[dict]:
    """The config's backbone settings if the backbone is one of ours, else None."""
    backbone = cfg.model.get('backbone') or {}
    return backbone if str(backbone.get('type', '')).rsplit('.', 1)[-1] in ('PyramidCPVT', 'CPVT') else None


def runner_checkpoint(cfg: Config, spec: str) -> str:
    """What mmengine's Runner loads (``load_from``) for a CHECKPOINT argument: an mmengine checkpoint as it is;
    for an mmpretrain config whose backbone is ours, also a model name with published weights, a URL or a bare
    weight file in any layout we read, written once as that classifier's checkpoint (``backbone.*``,
    ``head.fc.*``) beside the cached weights."""
    from ..convert import detect_layout, from_twins, load_weights_file, resolve_checkpoint, to_twins, weights_dir
    if cfg.get('default_scope') != 'mmpretrain' or _our_backbone(cfg) is None:
        return spec
    path = resolve_checkpoint(spec, classifier=True)
    state = load_weights_file(path)
    if detect_layout(state) == 'classifier':
        return str(path)
    out = weights_dir() / 'classifiers' / f'{path.stem}.mmpretrain.pth'
    if not out.is_file():
        atomic_write(out, lambda f: torch.save(dict(state_dict=from_twins(to_twins(state), 'classifier')), f))
    return str(out)
