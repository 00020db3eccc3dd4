"""The demo's CPU-sized tasks on the shapes data (``datasets.shapes``): their configs, the scores the demo reports,
the test sizes, the int8 calibration images. tools/demo.py runs ``DEMO_TASKS``; benchmarks/dense_study/ and
benchmarks/int8_scope.py study ``SHAPES_TASKS``. Paths are relative to the repository root."""
from pathlib import Path
from typing import NamedTuple


class ShapesTask(NamedTuple):
    scope: str      # the framework, a key of adapters.evaluation.METRICS
    config: str     # relative to the repository root
    start: str = 'pretraining'   # whose backbone the demo starts it from: the pretraining or another task


class Score(NamedTuple):
    """One column of the demo's summary: a task's metric (a key of its test loop's metrics) as a fraction (0-1)."""
    task: str
    metric: str
    label: str
    scale: float    # metric value -> fraction


PRETRAINING = 'configs/shapes/pcpvt-tiny_shapes-cls.py'
SHAPES_TASKS = {'detection': ShapesTask('mmdet', 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py'),
                'segmentation': ShapesTask('mmseg', 'configs/shapes/fpn_pcpvt-tiny_shapes.py', start='detection')}
# The demo trains the detectors from the pretrained backbone and the segmentors from RetinaNet's, starting them in
# this order as lanes free up (the longer of two ready tasks first).
DEMO_TASKS = {'detection': SHAPES_TASKS['detection'],
              'instances': ShapesTask('mmdet', 'configs/shapes/mask-rcnn_pcpvt-tiny_fpn_shapes.py'),
              'upernet': ShapesTask('mmseg', 'configs/shapes/upernet_pcpvt-tiny_shapes.py', start='detection'),
              'segmentation': SHAPES_TASKS['segmentation']}
SCORES = {'detection': Score('detection', 'coco/bbox_mAP', 'RetinaNet bbox mAP', 1.),
          'instances-bbox': Score('instances', 'coco/bbox_mAP', 'Mask R-CNN bbox mAP', 1.),
          'instances-segm': Score('instances', 'coco/segm_mAP', 'Mask R-CNN segm mAP', 1.),
          'segmentation': Score('segmentation', 'mIoU', 'Semantic FPN mIoU', .01),
          'upernet': Score('upernet', 'mIoU', 'UperNet mIoU', .01)}
# (label, resize target as multiples (W, H) of the training scale or None for the native size, keep ratio).
# With keep_ratio, Resize fits the longer side to the target, so most sizes are not multiples of 32.
TEST_SIZES = [
    ('training scale (1x)', (1., 1.), True),
    ('smaller (0.7x)', (.7, .7), True),
    ('larger (1.5x)', (1.5, 1.5), True),
    ('larger (2x)', (2., 2.), True),
    ('odd aspect (stretched to 1.6x W, 0.8x H)', (1.6, .8), False),
    ('native image size (128-288 px)', None, True),
]
# Static int8 is calibrated once per model, at the training scale, on training images (never the test split).
CALIBRATION = 'data/shapes/train/images'


def scaled(cfg, factors):
    """Resize target (W, H) for factors of the config's training scale (long side); None stays None."""
    return None if factors is None else tuple(round(s * f) for s, f in zip(cfg.train_scale, factors, strict=True))


def final_checkpoint(out: Path, name: str, cfg) -> Path:
    """Where the demo's training of ``cfg`` in out/``name`` leaves its final weights."""
    return Path(out) / name / f'iter_{cfg.train_cfg.max_iters}.pth'


__all__ = ['CALIBRATION', 'DEMO_TASKS', 'PRETRAINING', 'SCORES', 'SHAPES_TASKS', 'TEST_SIZES', 'Score', 'ShapesTask',
           'final_checkpoint', 'scaled']
