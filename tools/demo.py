"""The main demo: train detectors and segmentors with pcpvt_tiny on the embedded shapes data, on CPU, and test
them at resolutions they never saw in training.

Steps, as one would with ImageNet weights: generate data/shapes and the shape crops (data/shapes_cls);
pretrain pcpvt_tiny as a classifier of the crops (configs/shapes/pcpvt-tiny_shapes-cls.py, our stand-in for
ImageNet pretraining); train RetinaNet and Mask R-CNN from that backbone, Semantic FPN and UperNet from
RetinaNet's (loaded through init_cfg=Pretrained; --tasks picks some), with mmengine's progress logs; evaluate
COCO bbox and segm mAP (mmdet's CocoMetric) and mIoU (mmseg's IoUMetric) on the held-out split at the training
scale and at smaller, larger, odd-aspect and native sizes (most not divisible by 32), one image at a time and
in padded batches of 8 (``--batch-sizes``: each image predicted as alone, so the scores agree); draw confident
predictions at unseen sizes under work_dirs/demo/vis (vis/sheet.png: one image at several sizes, every task);
print and save a summary table (work_dirs/demo/summary.{md,json}, with the code's git commit and the CPU). After the
pretraining, the tasks run in --jobs worker processes that share the cores, each task trained, evaluated and drawn in
one. A finished training run in work_dirs/demo is reused unless --retrain.

Two runs with the same arguments on one machine give the same table: every training and evaluation runs on a thread
count the demo sets (--threads per task, the pretraining on --jobs x --threads), whatever OMP_NUM_THREADS says, and
the configs fix the seeds (another CPU ISA or thread count rounds otherwise: docs/reliability.md).
"""
import argparse
import json
import multiprocessing
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from matplotlib.patches import Patch, Rectangle

from cpvt_backbones.adapters.engines import DEFAULT_ENGINE, calibrate
from cpvt_backbones.adapters.evaluation import evaluate, set_test_scale
from cpvt_backbones.adapters.inference import StrictWeights
from cpvt_backbones.adapters.runner import build_runner, load_config, quiet_known_warnings
from cpvt_backbones.adapters.shapes_tasks import (
    CALIBRATION,
    DEMO_TASKS,
    PRETRAINING,
    SCORES,
    TEST_SIZES,
    final_checkpoint,
    scaled,
)
from cpvt_backbones.datasets import generate_shape_crops, generate_shapes
from cpvt_backbones.deploy import PRECISIONS
from cpvt_backbones.deploy.registry import ENGINES, engine_table
from cpvt_backbones.utils import atomic_path, atomic_write, cpu_info, pyplot

VIS_SIZES = [('0.7x', (.7, .7)), ('1x', (1., 1.)), ('native', None), ('2x', (2., 2.))]
SCORE_THR = 0.5  # boxes and masks drawn: confident ones only (the detectors return up to 50 candidates per image)


def cores() -> int:
    """The CPU cores this process may run on (its affinity; every core where the system does not say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def code_commit() -> dict:
    """The git commit of the code the demo runs (``commit``, None outside a git checkout) and whether tracked
    files differ from it (``dirty``, None where unknown)."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(['git', '-C', str(root), 'rev-parse', 'HEAD'], capture_output=True, text=True,
                                check=True).stdout.strip()
        status = subprocess.run(['git', '-C', str(root), 'status', '--porcelain', '--untracked-files=no'],
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return dict(commit=None, dirty=None)
    return dict(commit=commit, dirty=bool(status.strip()))


def train(name: str, config: str, out: Path, retrain: bool, init_from: str = None,
          threads: int | None = None) -> tuple[str, bool]:
    """The final checkpoint of ``config`` trained in out/``name``, and whether it was trained now (not reused).
    Torch runs on ``threads`` threads from here on (default ``cores()``), whatever OMP_NUM_THREADS says: with
    the configs' fixed seeds the weights then depend only on the machine, the code and the thread count."""
    torch.set_num_threads(threads or cores())
    cfg = load_config(config, work_dir=str(out / name))
    if init_from is not None:
        cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=init_from, prefix='backbone.')
    cfg.train_cfg.val_interval = cfg.train_cfg.max_iters + 1  # evaluated below, at every test size
    final = final_checkpoint(out, name, cfg)
    if final.is_file() and not retrain:
        print(f'[demo] {name}: reusing {final} (pass --retrain to train again)')
        return str(final), False
    start = time.perf_counter()
    build_runner(cfg).train()
    print(f'[demo] {name}: trained {cfg.train_cfg.max_iters} iterations in {time.perf_counter() - start:.0f} s')
    return str(final), True


def predict(scope: str, config: str, checkpoint: str, images: list[str], factors) -> tuple[list, dict]:
    """Data samples for ``images`` tested at ``factors`` of the training scale (None: native size)."""
    cfg = load_config(config)
    set_test_scale(cfg, scaled(cfg, factors))
    if scope == 'mmdet':
        from mmdet.apis import DetInferencer
        inferencer = type('DetInferencer', (StrictWeights, DetInferencer), {})(
            model=cfg, weights=checkpoint, device='cpu', show_progress=False)
    else:
        from mmseg.apis import MMSegInferencer
        inferencer = type('MMSegInferencer', (StrictWeights, MMSegInferencer), {})(
            model=cfg, weights=checkpoint, device='cpu')
    result = inferencer(images, return_datasamples=True)  # mmdet: a dict; mmseg: the samples themselves
    samples = result['predictions'] if isinstance(result, dict) else result
    return samples if isinstance(samples, list) else [samples], inferencer.model.dataset_meta


def _overlay(ax, labels: np.ndarray, palette: np.ndarray, names) -> None:
    """``labels`` (0 background, 1.. ``palette``/``names`` rows) over the image, with a legend of those shown."""
    overlay = np.concatenate([palette[labels], np.where(labels > 0, 0.6, 0.)[..., None]], axis=-1)
    ax.imshow(overlay)
    ax.legend(handles=[Patch(color=palette[c], label=names[c]) for c in np.unique(labels) if c > 0],
              loc='lower left', fontsize=7, framealpha=0.8, handlelength=1)


def draw(ax, image: np.ndarray, sample, meta: dict, scope: str, title: str) -> None:
    """Boxes scoring at least SCORE_THR (label and score in a fixed, legible font) with their instance masks where
    the detector predicts them, or the segmentation over the image with a legend of the classes it shows."""
    ax.imshow(image)
    if scope == 'mmdet':
        inst = sample.pred_instances
        keep = inst.scores >= SCORE_THR
        palette = (np.array(meta['palette'], dtype=np.float32) / 255 if 'palette' in meta
                   else np.tile(np.array([1., 1., 0.], dtype=np.float32), (len(meta['classes']), 1)))
        if 'masks' in inst:   # the most confident instance on top
            labels = np.zeros(image.shape[:2], dtype=np.int64)
            for mask, label in reversed(list(zip(inst.masks[keep].numpy(), inst.labels[keep].tolist(), strict=True))):
                labels[mask.astype(bool)] = label + 1
            _overlay(ax, labels, np.concatenate([np.zeros((1, 3), np.float32), palette]), ('', *meta['classes']))
        for box, score, label in zip(inst.bboxes[keep].tolist(), inst.scores[keep].tolist(),
                                     inst.labels[keep].tolist(), strict=False):
            ax.add_patch(Rectangle(box[:2], box[2] - box[0], box[3] - box[1], fill=False, lw=2, ec=palette[label]))
            ax.text(box[0] + 2, box[1] + 2, f'{meta["classes"][label]} {score:.2f}', fontsize=8, color='white',
                    va='top', bbox=dict(fc=palette[label], ec='none', pad=1, alpha=0.85))
        title += f'\n{int(keep.sum())} instances >= {SCORE_THR}'
    else:
        _overlay(ax, sample.pred_sem_seg.data[0].numpy(), np.array(meta['palette'], dtype=np.float32) / 255,
                 meta['classes'])
    ax.set_title(title, fontsize=9)
    ax.axis('off')


def _images() -> tuple[list[str], list[np.ndarray]]:
    """The first four held-out images: paths and RGB pixels."""
    from PIL import Image
    images = [str(p) for p in sorted(Path('data/shapes/val/images').glob('*.jpg'))[:4]]
    return images, [np.asarray(Image.open(p).convert('RGB')) for p in images]


def visualise(out: Path, name: str, checkpoint: str) -> list:
    """The first four held-out images with ``name``'s predictions at every drawn size (vis/<name>/<size>.png);
    returns, per size, the first image's (sample, dataset meta) for the sheet."""
    plt = pyplot()
    task, (images, pixels), cells = DEMO_TASKS[name], _images(), []
    for tag, factors in VIS_SIZES:
        samples, meta = predict(task.scope, task.config, checkpoint, images, factors)
        fig, row = plt.subplots(1, len(images), figsize=(3.4 * len(images), 3.9), squeeze=False)
        for ax, image, path, sample in zip(row[0], pixels, images, samples, strict=False):
            h, w = sample.metainfo['img_shape'][:2]
            draw(ax, image, sample, meta, task.scope, f'{Path(path).name}, tested at {w}x{h}')
        fig.tight_layout()
        with atomic_path(out / 'vis' / name / f'{tag}.png') as target:
            fig.savefig(target, dpi=100, bbox_inches='tight')
        plt.close(fig)
        cells.append((samples[0], meta))
    return cells


def draw_sheet(out: Path, cells: dict) -> None:
    """One image at every drawn size, a row per task (vis/sheet.png), from ``visualise``'s cells per task."""
    plt = pyplot()
    images, pixels = _images()
    sheet, axes = plt.subplots(len(cells), len(VIS_SIZES), figsize=(3.4 * len(VIS_SIZES), 3.9 * len(cells)),
                               squeeze=False)
    for r, (name, row) in enumerate(cells.items()):
        for c, ((tag, _), (sample, meta)) in enumerate(zip(VIS_SIZES, row, strict=True)):
            h, w = sample.metainfo['img_shape'][:2]
            draw(axes[r, c], pixels[0], sample, meta, DEMO_TASKS[name].scope, f'{name}, {tag}: tested at {w}x{h}')
    sheet.suptitle(f'{Path(images[0]).name} ({pixels[0].shape[1]}x{pixels[0].shape[0]}) at several test sizes; '
                   'predictions drawn on the original image', fontsize=11)
    sheet.tight_layout(rect=(0, 0, 1, 0.95))
    with atomic_path(out / 'vis' / 'sheet.png') as target:
        sheet.savefig(target, dpi=100, bbox_inches='tight')
    plt.close(sheet)


class TaskRun(NamedTuple):
    checkpoint: str
    trained: bool    # False where a finished training was reused
    scores: dict     # SCORES key -> test size label -> 'engine precision' -> value
    cells: list      # visualise's sheet cells
    seconds: float


def column_name(engine: str, precision: str, batch_size: int) -> str:
    """A summary column: engine and precision, and the evaluation batch size where it is not 1."""
    return f'{engine} {precision}' + (f' batch {batch_size}' if batch_size != 1 else '')


def run_task(name: str, out: Path, retrain: bool, init_from: str, runs: list, int8_ranges: bool,
             threads: int) -> TaskRun:
    """Train DEMO_TASKS[``name``] from the backbone in ``init_from``, evaluate it at every test size on every
    (engine, precision, batch size) of ``runs`` and draw its predictions, on ``threads`` torch threads: one lane
    of the demo, run in a worker process."""
    start = time.perf_counter()
    task = DEMO_TASKS[name]
    checkpoint, trained = train(name, task.config, out, retrain, init_from=init_from, threads=threads)
    ranges = calibrate(load_config(task.config), checkpoint, CALIBRATION, 32) if int8_ranges else None
    scores = {key: {} for key, score in SCORES.items() if score.task == name}
    for label, factors, keep_ratio in TEST_SIZES:
        cfg = load_config(task.config)
        set_test_scale(cfg, scaled(cfg, factors), keep_ratio)
        for engine, precision, batch_size in runs:
            column = column_name(engine, precision, batch_size)
            cfg.test_dataloader.batch_size = batch_size
            metrics = evaluate(cfg, checkpoint, str(out / name / 'eval'),
                               f'{name}-{label}-{engine}-{precision}-batch{batch_size}', precision,
                               ranges if (engine, precision) == ('fused', 'int8') else None, engine,
                               CALIBRATION if precision == 'int8' else None, 32)
            for key in scores:   # 0 where a metric is missing: no box passed the score threshold
                value = float(metrics.get(SCORES[key].metric, 0.)) * SCORES[key].scale
                scores[key].setdefault(label, {})[column] = value
                print(f'[demo] {name:<12} {label:<36} {column} {SCORES[key].label} = {value:.3f}', flush=True)
    return TaskRun(checkpoint, trained, scores, visualise(out, name, checkpoint), time.perf_counter() - start)


def _lane() -> None:
    """A worker process's set-up: the known warnings quiet, and the configs' start method for the processes it
    makes itself (a spawned worker starts as 'spawn', which mmengine would warn about and replace by the configs'
    'fork'). Its threads are set by each task it runs (``run_task``)."""
    quiet_known_warnings()
    multiprocessing.set_start_method('fork', force=True)


def run_lanes(names: list[str], jobs: int, out: Path, retrain: bool, pretrained: str, runs: list,
              int8_ranges: bool, threads: int) -> dict[str, TaskRun]:
    """``run_task`` for each of ``names`` on ``jobs`` worker processes sharing the cores, ``threads`` torch
    threads each, in DEMO_TASKS order: a task starts once a lane is free and the task it starts from has finished
    training (a finished training that is reused counts from the start)."""
    checkpoints = {'pretraining': pretrained}
    if not retrain:
        checkpoints.update((name, str(final)) for name in names
                           if (final := final_checkpoint(out, name, load_config(DEMO_TASKS[name].config))).is_file())
    done, running, waiting = {}, {}, list(names)
    context = multiprocessing.get_context('spawn')   # a fresh interpreter: no forked OpenMP or runner state
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_lane) as pool:
        while waiting or running:
            for name in [n for n in waiting if DEMO_TASKS[n].start in checkpoints][:jobs - len(running)]:
                init_from = checkpoints[DEMO_TASKS[name].start]
                running[pool.submit(run_task, name, out, retrain, init_from, runs, int8_ranges, threads)] = name
                waiting.remove(name)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                name = running.pop(future)
                done[name] = future.result()
                checkpoints[name] = done[name].checkpoint
                print(f'[demo] {name}: trained, evaluated and drawn in {done[name].seconds:.0f} s', flush=True)
    return {name: done[name] for name in names}


def _with_starts(names: list[str]) -> list[str]:
    """``names`` and the tasks whose backbones start them, each after its start, in ``DEMO_TASKS`` order."""
    wanted = set(names)
    for name in names:
        start = DEMO_TASKS[name].start
        while start in DEMO_TASKS:
            wanted.add(start)
            start = DEMO_TASKS[start].start
    return [name for name in DEMO_TASKS if name in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='work_dirs/demo')
    parser.add_argument('--retrain', action='store_true')
    parser.add_argument('--tasks', nargs='+', default=list(DEMO_TASKS), choices=list(DEMO_TASKS),
                        help='the dense models to train and evaluate (default all: detection RetinaNet, instances '
                             "Mask R-CNN, segmentation Semantic FPN, upernet UperNet); a task's starting backbone is "
                             'trained with it')
    parser.add_argument('--jobs', type=int, default=2,
                        help='tasks trained at once after the pretraining, in worker processes sharing the cores '
                             '(default 2: on 2 cores one thread each, which trains faster in all than one task on '
                             'both)')
    parser.add_argument('--threads', type=int,
                        help='torch threads of each task after the pretraining, whatever OMP_NUM_THREADS says; the '
                             'pretraining runs on --jobs times as many (default: the cores this process may use '
                             'divided among the tasks run at once, at least 1)')
    parser.add_argument('--precisions', nargs='+', default=['fp32'], choices=PRECISIONS,
                        help='evaluate the trained models at these precisions, on every --engines engine (int8 '
                             'calibrated on 32 training images: activation ranges fixed once on the fused engine, NNCF '
                             'on OpenVINO); an engine is evaluated at the precisions it runs')
    parser.add_argument('--engines', nargs='+', default=[DEFAULT_ENGINE], choices=list(ENGINES),
                        help=f'evaluate on these engines (default {DEFAULT_ENGINE}; the table below says which runs '
                             'which precision, covering what)')
    parser.add_argument('--batch-sizes', nargs='+', type=int, default=[1, 8],
                        help='evaluate at these test batch sizes (default 1 and 8: a batch pads its images to the '
                             'largest, and each image is predicted as alone: type PredictAlone); the first engine and '
                             'precision at each, the others at the first')
    parser.epilog = 'Engines (deploy.ENGINES):\n' + engine_table()
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f'--jobs must be at least 1, got {args.jobs}')
    if min(args.batch_sizes) < 1:
        parser.error(f'--batch-sizes must be at least 1, got {args.batch_sizes}')
    if args.threads is not None and args.threads < 1:
        parser.error(f'--threads must be at least 1, got {args.threads}')
    quiet_known_warnings()
    out = Path(args.out)
    start = time.perf_counter()
    print('[demo] data:', generate_shapes('data/shapes'), 'crops:', generate_shape_crops('data/shapes_cls'))

    names = _with_starts(args.tasks)
    jobs = min(args.jobs, len(names))
    threads = args.threads or max(1, cores() // jobs)
    checkpoint, pretrained = train('pretraining', PRETRAINING, out, args.retrain, threads=jobs * threads)
    accuracy = evaluate(load_config(PRETRAINING), checkpoint, str(out / 'pretraining' / 'eval'), 'crops')
    print(f'[demo] pretraining: top-1 {accuracy["accuracy/top1"]:.1f}% on the 400 held-out crops')
    scores = {key: score for key, score in SCORES.items() if score.task in names}
    pairs = [(engine, precision) for engine in args.engines for precision in args.precisions
             if precision in ENGINES[engine].precisions]
    runs = [(*pairs[0], n) for n in args.batch_sizes] + [(*pair, args.batch_sizes[0]) for pair in pairs[1:]]
    int8_ranges = 'int8' in args.precisions and 'fused' in args.engines
    lanes = run_lanes(names, jobs, out, args.retrain, checkpoint, runs, int8_ranges, threads)
    results = {key: lanes[score.task].scores[key] for key, score in scores.items()}

    columns = [(key, column_name(*run)) for key in scores for run in runs]
    lines = ['| test resolution | ' + ' | '.join(scores[k].label + (f' {p}' if len(runs) > 1 else '')
                                                for k, p in columns) + ' |', '|---|' + '---|' * len(columns)]
    for label, _, _ in TEST_SIZES:
        lines.append(f'| {label} | ' + ' | '.join(f'{results[k][label][p]:.3f}' for k, p in columns) + ' |')
    table = '\n'.join(lines)
    print('\n[demo] held-out split (150 images); training scale (long side): detection 192, segmentation 160\n'
          + table)
    draw_sheet(out, {name: run.cells for name, run in lanes.items()})
    minutes = (time.perf_counter() - start) / 60
    atomic_write(out / 'summary.md', (table + f'\n\nPretraining: top-1 {accuracy["accuracy/top1"]:.1f}% on the '
                                              f'held-out crops. {minutes:.1f} min in total\n').encode())
    atomic_write(out / 'summary.json', json.dumps(dict(
        results=results, labels={key: score.label for key, score in scores.items()},
        pretraining_top1=accuracy['accuracy/top1'], minutes=minutes, jobs=jobs,
        threads=dict(pretraining=jobs * threads, task=threads),
        trained=['pretraining'] * pretrained + [name for name, run in lanes.items() if run.trained],
        task_seconds={name: round(run.seconds) for name, run in lanes.items()},
        command=shlex.join(['python', 'tools/demo.py'] + sys.argv[1:]), torch=torch.__version__, **code_commit(),
        **cpu_info()), indent=2).encode())
    print(f'[demo] visualisations in {out / "vis"}; summary in {out / "summary.md"}; {minutes:.1f} min in total')


if __name__ == '__main__':
    main()
