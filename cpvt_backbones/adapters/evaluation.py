"""Evaluating a config's model for our tools and studies: each framework's headline metric, the test pipeline
resized to a test size, and the config's test loop on a checkpoint loaded strictly, on either inference engine."""
import copy
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from mmengine.config import Config

from .custom_hooks import set_engine, strict_checkpoint
from .engines import config_request
from .runner import build_runner, evaluation_datasets

__all__ = ['METRICS', 'Metric', 'evaluate', 'headline_score', 'set_cls_test_size', 'set_test_scale']
_CLS_RESIZE_STEPS = ('Resize', 'ResizeEdge', 'RandomResize', 'CenterCrop', 'RandomResizedCrop')


class Metric(NamedTuple):
    key: str        # in the metrics the framework's test loop returns
    label: str
    scale: float    # to a percentage


# The headline score of each framework's test loop.
METRICS = {'mmpretrain': Metric('accuracy/top1', 'top-1 accuracy (%)', 1.),
           'mmdet': Metric('coco/bbox_mAP', 'bbox mAP (x100)', 100.),
           'mmseg': Metric('mIoU', 'mIoU (%)', 1.)}


def headline_score(scope: str, metrics: Mapping[str, float]) -> float:
    """The framework's headline score as a percentage; 0 where the metric is missing (mmdet's CocoMetric reports
    nothing when no box passes the score threshold)."""
    metric = METRICS[scope]
    return metric.scale * float(metrics.get(metric.key, 0.))


def set_test_scale(cfg: Config, scale: Sequence[int] | None, keep_ratio: bool = True) -> None:
    """Make the test pipeline resize to ``scale`` (W, H), or, with ``scale=None``, keep each image's own size
    (a resize by 1.0, which records the scale factor that mmdet's post-processing expects)."""
    for dataset in evaluation_datasets(cfg):
        steps = [s for s in dataset.pipeline if s['type'] not in ('Resize', 'RandomResize')]
        resize = dict(scale_factor=1.0) if scale is None else dict(scale=tuple(scale))
        steps.insert(1, dict(type='Resize', keep_ratio=keep_ratio, **resize))
        dataset.pipeline = steps


def set_cls_test_size(cfg: Config, size: int, crop_ratio: float | None = None) -> None:
    """Classification at ``size`` x ``size`` without fine-tuning: resize the short side to ``size / crop_ratio``
    (bicubic) and centre-crop ``size``, the crop ratio kept from training (the config's ``crop_ratio``: 0.875
    for ImageNet, i.e. 256 -> 224; 1 when whole images are used)."""
    ratio = cfg.get('crop_ratio', 1.0) if crop_ratio is None else crop_ratio
    for dataset in evaluation_datasets(cfg):
        steps = [s for s in dataset.pipeline if s['type'] not in _CLS_RESIZE_STEPS]
        steps[1:1] = [dict(type='ResizeEdge', scale=round(size / ratio), edge='short', backend='pillow',
                           interpolation='bicubic'), dict(type='CenterCrop', crop_size=size)]
        dataset.pipeline = steps


def evaluate(cfg: Config, checkpoint: str, work_dir: str, name: str, precision: str = 'fp32',
             input_ranges: str | None = None, engine: str | None = None, calibration_source: str | None = None,
             calibration_images: int = 32, keep_fp32: Sequence[str] | None = None,
             allow_nonfinite: bool = False) -> dict:
    """Run the config's test loop on ``checkpoint`` and return its metrics. The checkpoint must fit the model
    exactly: one that does not (another model's), or (unless ``allow_nonfinite``) one with NaN or Inf weights, is
    refused before anything is evaluated (``custom_hooks.strict_checkpoint``: ``CheckpointMismatchError``,
    ``NonFiniteWeightsError``), and an empty, truncated or corrupt file is a ``WeightFileError`` naming it. The
    model runs on ``engine`` at ``precision`` (``adapters.engines.config_request``; by default
    ``default_engine(cfg)``): int8 calibrated on ``calibration_images`` of ``calibration_source`` ('val' by
    default), or for the fused engine at ``input_ranges`` (a file of ``adapters.engines.calibrate``: ranges fixed
    once for every test size), leaving the modules of ``kept_in_fp32(cfg, keep_fp32)`` in float32."""
    cfg = copy.deepcopy(cfg)
    ranges = dict(input_ranges=str(input_ranges)) if input_ranges else {}
    set_engine(cfg, config_request(cfg, engine, precision, calibration_source, calibration_images, keep_fp32,
                                   **ranges))
    strict_checkpoint(cfg, checkpoint, allow_nonfinite)
    cfg.work_dir = work_dir
    cfg.experiment_name = name
    cfg.log_level = 'WARNING'
    cfg.default_hooks.pop('visualization', None)
    return build_runner(cfg).test()
