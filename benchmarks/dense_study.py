"""Resolution generalisation on the dense tasks: the position encodings against the peer a user would pick, on the
shapes data.

    python -m benchmarks.dense_study [--seeds 0 1 2] [--det-iters 300] [--seg-iters 350] [--shard K/N] [--out DIR]

RetinaNet and Semantic FPN as in the demo (configs/shapes), with five backbones that share widths
(32/64/160/256), depths (2-2-2-2), heads (1/2/5/8), MLP ratio (4) and reduction ratios (8/4/2/1):

  peg         pcpvt_tiny: a PEG after the first block of every stage
  pvt         mmdet's own PyramidVisionTransformer (PVT v1), unmodified: a learned absolute embedding per stage
              for the training scale, resized bilinearly to every input
  none        pcpvt_tiny without PEGs: no position encoding
  learned     pcpvt_tiny with our learned table per stage for the training scale, resized bicubically
  rope_mixed  pcpvt_tiny with RoPE-Mixed (Heo et al.) in every block's attention

and, asked for by name (``--variants svt svt_unmasked --name dense_svt_window_mask``: which windows the SVT
dense configs should use), two Twins-SVTs of the same widths, depths, heads and ratios, windows of 7 x 7 tokens:

  svt           the padding of every window masked out of its attention (the Twins release's dense code)
  svt_unmasked  the padded tokens taking part as keys (timm's behaviour)

The rule for the configs, fixed before those runs: they keep masked windows unless the unmasked SVT is ahead,
paired by seed with a 95% interval excluding zero, in bbox mAP or mIoU at 1x or on the mean over the resized
sizes; masking is also what keeps an image's windowed attention independent of how far its map is padded.

The detector is trained from scratch; the segmentor starts from the backbone of the detector with the same
backbone and seed (the demo's stand-in for ImageNet pretraining; ``--seg-init scratch`` trains it from scratch
too). PVT's table is made for the detector's training scale in both tasks, so it carries over whole and is
resized to the segmentor's inputs, as a user fine-tuning pretrained PVT weights would have it.

Same data (800 training and 100 held-out scenes, in data/shapes_dense), schedule and seeds. Each model is
tested on the held-out split resized (long side) to 0.5x, 0.7x, 1x, 1.5x, 2x and 3x the training scale and at
the images' native sizes, and on the same held-out scenes drawn natively at 1x, 2x and 3x the training scale's
long side (``drawnF``, any of the six with --factors: crisp edges and texture at the test resolution, where a
resize only interpolates; ``datasets.shapes.generate_drawn_split``): bbox mAP and mIoU, mean and standard
deviation over seeds. Resumable: a finished run (trained and evaluated) is skipped, a test it lacks is run on its final
weights, an interrupted training resumes from its last checkpoint; ``--shard K/N`` takes every N-th run from the
K-th, so N single-thread processes can share the study. Writes NAME.{json,csv,md,png} under --out once every
run has finished.
"""
import argparse
import copy
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.study.common import format_paired, mean_std, paired, parse_shard, run_meta, study_dir
from benchmarks.study.grid import Grid, write_report
from cpvt_backbones.adapters.evaluation import METRICS, headline_score
from cpvt_backbones.adapters.runner import build_runner, quiet_known_warnings
from cpvt_backbones.adapters.shapes_tasks import SHAPES_TASKS as TASKS
from cpvt_backbones.convert import safe_load
from cpvt_backbones.models import PyramidCPVT, model_settings
from cpvt_backbones.utils import atomic_write, pyplot, strip_prefix

ROOT = Path(__file__).resolve().parents[1]



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
    """The study's settings: one field per command-line option of the same name (``parse_args`` documents them),
    ``--shard`` as its two numbers."""
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


def parse_args(argv: Sequence[str] | None = None) -> DenseStudyConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--tasks', nargs='+', default=list(TASKS), choices=list(TASKS))
    p.add_argument('--variants', nargs='+', default=list(STUDIED), choices=list(VARIANTS))
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p.add_argument('--det-iters', type=int, default=300)
    p.add_argument('--seg-iters', type=int, default=350)
    p.add_argument('--seg-init', choices=('detection', 'scratch'), default='detection',
                   help="the segmentor's backbone: the same variant and seed's detector backbone, or random")
    p.add_argument('--factors', nargs='+', default=list(DEFAULT_FACTORS), choices=list(FACTORS))
    p.add_argument('--data', default='data/shapes_dense', help='the shapes data (generated there if missing)')
    p.add_argument('--num-train', type=int, default=800)
    p.add_argument('--num-val', type=int, default=100)
    p.add_argument('--shard', default='0/1', help='K/N: run every N-th (task, variant, seed) from the K-th (0-based)')
    p.add_argument('--work-dir', type=Path, default=study_dir('dense_study'))
    p.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results')
    p.add_argument('--name', default='dense_study')
    args = p.parse_args(argv)
    shard_index, num_shards = parse_shard(p, args.shard)
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()}  # immutable throughout
    del options['shard']
    return DenseStudyConfig(**options, shard_index=shard_index, num_shards=num_shards)


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
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
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
    atomic_write(result_path, json.dumps(result, indent=2).encode())
    return result


def summarise(results: list[dict], settings: DenseStudyConfig) -> list[dict]:
    rows = []
    for task in settings.tasks:
        for variant in settings.variants:
            runs = sorted((r for r in results if r['task'] == task and r['variant'] == variant),
                          key=lambda r: r['seed'])
            for factor in settings.factors:
                values = [r['scores'][factor] for r in runs]
                m, sd = mean_std(values)
                rows.append(dict(task=task, variant=variant, factor=factor, mean=m, std=sd,
                                 per_seed=[round(v, 2) for v in values], seeds=[r['seed'] for r in runs]))
    return rows


def plot(rows: list[dict], settings: DenseStudyConfig, path: Path) -> None:
    plt = pyplot()
    scaled = [f for f in SCALES if f in settings.factors]
    drawn = [f for f in SCALES if f'drawn{f}' in settings.factors]
    fig, axes = plt.subplots(1, len(settings.tasks), figsize=(5.8 * len(settings.tasks), 4.4), squeeze=False)
    for ax, task in zip(axes[0], settings.tasks, strict=False):
        for i, variant in enumerate(settings.variants):
            r = {row['factor']: row for row in rows if row['task'] == task and row['variant'] == variant}
            line = ax.errorbar([float(f) for f in scaled], [r[f]['mean'] for f in scaled],
                               yerr=[r[f]['std'] for f in scaled], marker='o', capsize=3, label=VARIANTS[variant])
            colour = line[0].get_color()
            if drawn:
                ax.errorbar([float(f) * 1.02 for f in drawn], [r[f'drawn{f}']['mean'] for f in drawn],
                            yerr=[r[f'drawn{f}']['std'] for f in drawn], marker='^', ls='--', capsize=3, color=colour)
            if 'native' in r:
                ax.errorbar([3.35 + 0.06 * i], [r['native']['mean']], yerr=[r['native']['std']], marker='s',
                            capsize=3, color=colour)
        ax.axvline(1, color='grey', ls=':', lw=1)
        ax.set_xticks([float(f) for f in scaled] + ([3.4] if 'native' in settings.factors else []))
        ax.set_xticklabels(scaled + (['native'] if 'native' in settings.factors else []))
        ax.set_xlabel('test long side / training long side\nsolid: resized; dashed: drawn at that size')
        ax.set_ylabel(label(task))
        ax.set_title(task)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    start = 'from scratch' if settings.seg_init == 'scratch' else "segmentor from the detector's backbone"
    fig.suptitle(f'shapes data, trained at 1x ({start}); mean +- std over {len(settings.seeds)} seeds', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def paired_differences(rows: list[dict], task: str, settings: DenseStudyConfig) -> dict[str, dict[str, dict]]:
    """For each variant after the first: its paired difference from the first (same seeds;
    ``study.common.paired``: mean and 95% t interval) at 1x and on the mean over the resized test sizes."""
    def per_seed(variant: str, factor: str) -> list[float]:
        (row,) = [r for r in rows if r['task'] == task and r['variant'] == variant and r['factor'] == factor]
        return row['per_seed']

    scaled = [f for f in SCALES if f in settings.factors]
    first, out = settings.variants[0], {}
    for variant in settings.variants[1:]:
        cells = {}
        if '1' in settings.factors:
            cells['1x'] = paired(per_seed(variant, '1'), per_seed(first, '1'))
        if scaled:
            means = [[statistics.mean(vals) for vals in zip(*(per_seed(v, f) for f in scaled), strict=True)]
                     for v in (variant, first)]
            cells['resized mean'] = paired(*means)
        out[variant] = cells
    return out


def paired_lines(rows: list[dict], task: str, settings: DenseStudyConfig) -> list[str]:
    """Markdown lines of ``paired_differences`` (nothing for a single variant)."""
    differences = paired_differences(rows, task, settings)
    if not differences:
        return []
    columns = list(next(iter(differences.values())))
    lines = [f'Paired by seed, minus {VARIANTS[settings.variants[0]]} (mean [95% interval]; a claim only where the '
             'interval excludes zero):', '', '| backbone | ' + ' | '.join(columns) + ' |',
             '|---|' + '---|' * len(columns)]
    lines += [f'| {VARIANTS[v]} | ' + ' | '.join(format_paired(cells[c]) for c in columns) + ' |'
              for v, cells in differences.items()]
    return lines + ['']


def write_outputs(rows: list[dict], results: list[dict], settings: DenseStudyConfig, meta: dict) -> None:
    lines = []

    def heading(factor: str) -> str:
        return factor if factor == 'native' else f'drawn {factor[5:]}x' if factor.startswith('drawn') else f'{factor}x'
    for task in settings.tasks:
        lines += [f'**{task}** ({label(task)})', '',
                  '| backbone | ' + ' | '.join(heading(f) for f in settings.factors) + ' |',
                  '|---|' + '---|' * len(settings.factors)]
        for variant in settings.variants:
            r = {row['factor']: row for row in rows if row['task'] == task and row['variant'] == variant}
            lines.append(f'| {VARIANTS[variant]} | ' + ' | '.join(
                f'{r[f]["mean"]:.1f} ± {r[f]["std"]:.1f}' for f in settings.factors) + ' |')
        lines.append('')
        lines += paired_lines(rows, task, settings)
    table = '\n'.join(lines)
    init = 'at random' if settings.seg_init == 'scratch' else 'from the detector backbone of the same variant and seed'
    markdown = (
        table + f'\nMean ± standard deviation over seeds {list(settings.seeds)} on the {settings.num_val} held-out '
        f'images. Iterations: detection {settings.det_iters}, segmentation {settings.seg_iters} (batch 8); segmentor '
        f'initialised {init}. Run time summed over runs (training and evaluation, one thread each): '
        f'{meta["run_minutes"]} min; this invocation: {meta["wall_minutes"]} min of wall time (runs already finished '
        f'are read from their result.json).\n\n'
        f'`{meta["command"]}`\n')
    write_report(settings.out, settings.name, dict(meta=meta, rows=rows, runs=results), markdown, rows,
                 {'': lambda path: plot(rows, settings, path)})
    print(table)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    settings = parse_args(argv)
    quiet_known_warnings()
    from cpvt_backbones.datasets import ShapesSpec, generate_shapes
    start = time.perf_counter()
    generate_shapes(settings.data, ShapesSpec(num_train=settings.num_train, num_val=settings.num_val))
    work = settings.work_dir

    def run_pair(seed: int, variant: str) -> list[dict]:  # a segmentor may start from the same pair's detector
        return [run(task, variant, seed, settings, work / f'{task}-{variant}-seed{seed}') for task in settings.tasks]
    grid = Grid([(seed, variant) for seed in settings.seeds for variant in settings.variants],
                lambda k: [work / f'{t}-{k[1]}-seed{k[0]}' for t in settings.tasks],
                settings.shard_index, settings.num_shards)
    for seed, variant in grid.shard():
        run_pair(seed, variant)
    if not grid.complete('dense'):
        return []
    results = [r for seed, variant in grid.keys for r in run_pair(seed, variant)]
    rows = summarise(results, settings)
    meta = dict(run_meta('benchmarks.dense_study', argv, start), seeds=list(settings.seeds),
                det_iters=settings.det_iters, seg_iters=settings.seg_iters, factors=list(settings.factors),
                num_train=settings.num_train, num_val=settings.num_val,
                run_minutes=round(sum(r['train_seconds'] + r['eval_seconds'] for r in results) / 60, 1))
    write_outputs(rows, results, settings, meta)
    print(f'[dense] {meta["wall_minutes"]} min; results in {settings.out}')
    return rows


if __name__ == '__main__':
    main()
