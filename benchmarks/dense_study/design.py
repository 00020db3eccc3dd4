"""The study's design: the backbones compared (``VARIANTS``, ``backbone``), the test sizes (``FACTORS``), the
settings (``DenseStudyConfig``), each run's mmengine config (``make_config``) and one run trained, or resumed,
then tested at every size its record lacks (``run``)."""
import copy
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.study import records
from cpvt_backbones.adapters.evaluation import METRICS, headline_score
from cpvt_backbones.adapters.runner import build_runner
from cpvt_backbones.adapters.shapes_tasks import SHAPES_TASKS as TASKS
from cpvt_backbones.convert import safe_load
from cpvt_backbones.models import PyramidCPVT, model_settings
from cpvt_backbones.utils import strip_prefix

ROOT = Path(__file__).resolve().parents[2]


def label(task: str) -> str:
    return METRICS[TASKS[task].scope].label


VARIANTS = {
    'peg': 'pcpvt_tiny (PEG)',
    'pvt': "mmdet PVT v1 (learned abs. PE, resized)",
    'none': 'pcpvt_tiny without PEG',
    'learned': 'pcpvt_tiny, learned table (ours, resized)',
    'rope_mixed': 'pcpvt_tiny, RoPE-Mixed',
    'svt': 'Twins-SVT (tiny), masked windows',
    'svt_unmasked': 'Twins-SVT (tiny), unmasked windows',
}
STUDIED = ('peg', 'pvt', 'none', 'learned', 'rope_mixed')   # the default study; the SVTs are asked for by name
SCALES = ('0.5', '0.7', '1', '1.5', '2', '3')
FACTORS = SCALES + ('native',) + tuple(f'drawn{f}' for f in SCALES)
# drawn at 1x is the control (resizing artefacts only); 2x and 3x are where a resize interpolates most
DEFAULT_FACTORS = SCALES + ('native', 'drawn1', 'drawn2', 'drawn3')


@dataclass(frozen=True)
class DenseStudyConfig:
    """The study's settings: one field per command-line option of the same name (``cli.parse_args`` documents
    them), ``--shard`` as its two numbers."""
    tasks: tuple[str, ...]
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    det_iters: int
    seg_iters: int
    seg_init: str
    factors: tuple[str, ...]
    data: str
    num_train: int
    num_val: int
    shard_index: int
    num_shards: int
    work_dir: Path
    out: Path
    name: str


def backbone(variant: str, task: str, table_size: int) -> dict:
    if variant == 'peg':
        return dict(type='PyramidCPVT', arch='pcpvt_tiny', drop_path_rate=0.0)
    encodings = dict(none='none', learned=dict(type='learned', img_size=table_size), rope_mixed='rope_mixed')
    if variant in encodings:
        return dict(type='PyramidCPVT', drop_path_rate=0.0,
                    arch=dict(base='pcpvt_tiny', pos_encoding=encodings[variant]))
    if variant in ('svt', 'svt_unmasked'):
        return dict(type='TwinsSVT', drop_path_rate=0.0,
                    arch=dict(model_settings('pcpvt_tiny', PyramidCPVT), window_sizes=(7, 7, 7, 7),
                              window_mask=variant == 'svt'))
    return dict(type='PyramidVisionTransformer' if task == 'detection' else
                'mmdet.PyramidVisionTransformer', pretrain_img_size=table_size, embed_dims=32,
                num_layers=[2, 2, 2, 2], num_heads=[1, 2, 5, 8], mlp_ratios=[4, 4, 4, 4], sr_ratios=[8, 4, 2, 1],
                patch_sizes=[4, 2, 2, 2], strides=[4, 2, 2, 2], drop_path_rate=0.0, out_indices=(0, 1, 2, 3),
                convert_weights=False)


def make_config(task: str, variant: str, seed: int, settings: DenseStudyConfig, work_dir: Path):
    from cpvt_backbones.adapters.runner import load_config
    cfg = load_config(str(ROOT / TASKS[task].config), work_dir=str(work_dir))
    det_cfg = cfg if task == 'detection' else load_config(str(ROOT / TASKS['detection'].config))
    cfg.model.backbone = backbone(variant, task, max(det_cfg.train_scale))
    if variant == 'pvt' and task == 'segmentation':
        cfg.custom_imports['imports'] = list(cfg.custom_imports['imports']) + ['mmdet.models']
    data_root = str(Path(settings.data)) + '/'
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root
    if task == 'detection':
        for evaluator in ('val_evaluator', 'test_evaluator'):
            cfg[evaluator].ann_file = data_root + 'annotations/val.json'
    iters = settings.det_iters if task == 'detection' else settings.seg_iters
    warmup = min(cfg.param_scheduler[0].end, max(1, iters // 10))
    cfg.param_scheduler[0].end = warmup
    cfg.param_scheduler[1].begin = warmup if task == 'segmentation' else 0
    cfg.param_scheduler[1].end = iters
    if 'T_max' in cfg.param_scheduler[1]:
        cfg.param_scheduler[1].T_max = iters
    cfg.train_cfg.max_iters = iters
    cfg.train_cfg.val_interval = iters + 1  # evaluated afterwards at every size
    cfg.default_hooks.checkpoint.interval = max(1, min(cfg.default_hooks.checkpoint.interval, iters // 4))
    cfg.default_hooks.logger.interval = max(1, min(50, iters))
    cfg.randomness = dict(seed=seed)
    cfg.resume = True  # continue from the work dir's last checkpoint, if any
    cfg.log_level = 'WARNING'
    return cfg, iters


def test_scale(cfg, factor: str):
    """The (W, H) bound the test pipeline resizes to; None for images taken at their own size."""
    return None if factor == 'native' or factor.startswith('drawn') else \
        tuple(round(s * float(factor)) for s in cfg.train_scale)


def use_drawn_split(cfg, factor: str, settings: DenseStudyConfig) -> None:
    """Point the test at the held-out scenes drawn natively with the long side of the ``factor`` resize."""
    from cpvt_backbones.datasets import ShapesSpec, generate_drawn_split
    long_side = round(float(factor[len('drawn'):]) * max(cfg.train_scale))
    root = generate_drawn_split(f'{settings.data}_drawn/{long_side}',
                                ShapesSpec(num_train=settings.num_train, num_val=settings.num_val), long_side)
    for loader in ('val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = f'{root}/'
    for evaluator in ('val_evaluator', 'test_evaluator'):
        if 'ann_file' in cfg[evaluator]:
            cfg[evaluator].ann_file = f'{root}/annotations/val.json'


def start_from_detector(cfg, detector: Path, path: Path) -> None:
    """Point the segmentor's backbone at the detector's, after checking that every key loads strictly
    (mmdet's PVT loads ``init_cfg`` weights with ``strict=False``, which would skip a mismatch silently)."""
    import mmdet.models  # noqa: F401  (registers mmdet's PVT)
    import torch
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS

    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the detector's log buffers load safely)
    import cpvt_backbones.adapters.mmseg  # noqa: F401
    if not detector.is_file():
        raise FileNotFoundError(f'the segmentor starts from the detector with the same backbone and seed, and '
                                f'{detector} is missing: run the detection task first (--tasks detection '
                                f'segmentation) or pass --seg-init scratch')
    weights = safe_load(detector)['state_dict']
    weights = strip_prefix(weights, 'backbone.', str(detector))
    with DefaultScope.overwrite_default_scope('mmseg'):
        MODELS.build(cfg.model.backbone).load_state_dict(weights, strict=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(weights, path)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=str(path))


def run(task: str, variant: str, seed: int, settings: DenseStudyConfig, run_dir: Path) -> dict:
    """Train (or resume) one model, then evaluate it at every test size; cached in result.json."""
    from cpvt_backbones.adapters.evaluation import evaluate, set_test_scale
    result_path = run_dir / 'result.json'
    result = records.read(result_path)
    if result is not None and all(f in result['scores'] for f in settings.factors):
        return result
    cfg, iters = make_config(task, variant, seed, settings, run_dir)
    final = run_dir / f'iter_{iters}.pth'
    start = time.perf_counter()
    if not final.is_file():
        if task == 'segmentation' and settings.seg_init == 'detection':
            detector = run_dir.parent / f'detection-{variant}-seed{seed}' / f'iter_{settings.det_iters}.pth'
            start_from_detector(cfg, detector, run_dir / 'backbone_from_detector.pth')
        build_runner(copy.deepcopy(cfg)).train()
    train_seconds = time.perf_counter() - start
    scores = dict(result['scores']) if result else {}
    start = time.perf_counter()
    for factor in (f for f in settings.factors if f not in scores):
        test_cfg = copy.deepcopy(cfg)
        test_cfg.resume = False
        set_test_scale(test_cfg, test_scale(cfg, factor))
        if factor.startswith('drawn'):
            use_drawn_split(test_cfg, factor, settings)
        scores[factor] = headline_score(TASKS[task].scope, evaluate(test_cfg, str(final), str(run_dir / 'eval'),
                                                                    f'{factor}x'))
        print(f'[dense] {task} {variant} seed {seed} @ {factor}: {label(task)} {scores[factor]:.2f}', flush=True)
    previous = result or dict(train_seconds=0., eval_seconds=0.)
    result = dict(task=task, variant=variant, seed=seed, iterations=iters, scores=scores,
                  train_seconds=round(previous['train_seconds'] + train_seconds, 1),
                  eval_seconds=round(previous['eval_seconds'] + time.perf_counter() - start, 1))
    return records.write(result_path, result)
