"""The main demo: train a detector and a segmentor with pcpvt_tiny on the embedded shapes data, on CPU, and
test them at resolutions they never saw in training.

Steps: generate data/shapes; train RetinaNet and Semantic FPN (mmengine progress logs); evaluate COCO bbox
mAP (mmdet's CocoMetric) and mIoU (mmseg's IoUMetric) on the held-out split at the training scale and at
smaller, larger, odd-aspect and native sizes (most not divisible by 32); draw predictions at unseen sizes
under work_dirs/demo/vis; print and save a summary table (work_dirs/demo/summary.{md,json}).
A finished training run in work_dirs/demo is reused unless --retrain is given.
"""
import argparse
import json
import time
from pathlib import Path

from mmengine.runner import Runner

from cpvt_backbones.adapters.runtime import evaluate, load_config, set_test_scale
from cpvt_backbones.datasets import generate_shapes

TASKS = {
    'detection': dict(config='configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py', metric='coco/bbox_mAP',
                      label='bbox mAP'),
    'segmentation': dict(config='configs/shapes/fpn_pcpvt-tiny_shapes.py', metric='mIoU', label='mIoU'),
}
# (label, resize target (W, H) or None for native size, keep aspect ratio)
TEST_SIZES = [
    ('train scale, short side <= 192', (192, 192), True),
    ('smaller, <= 128', (128, 128), True),
    ('larger, <= 288', (288, 288), True),
    ('larger, <= 384', (384, 384), True),
    ('odd aspect, 300 x 150 (stretched)', (300, 150), False),
    ('native size (128-288 px, any)', None, True),
]
VIS_SIZES = [('short-side-112', (112, 112)), ('native', None), ('long-side-400', (400, 400))]


def train(name: str, config: str, out: Path, retrain: bool) -> str:
    cfg = load_config(config, work_dir=str(out / name))
    final = out / name / f'iter_{cfg.train_cfg.max_iters}.pth'
    if final.is_file() and not retrain:
        print(f'[demo] {name}: reusing {final} (pass --retrain to train again)')
        return str(final)
    start = time.perf_counter()
    Runner.from_cfg(cfg).train()
    print(f'[demo] {name}: trained {cfg.train_cfg.max_iters} iterations in {time.perf_counter() - start:.0f} s')
    return str(final)


def visualise(name: str, config: str, checkpoint: str, out: Path) -> None:
    val_images = sorted((Path('data/shapes/val/images')).glob('*.jpg'))[:4]
    for tag, scale in VIS_SIZES:
        cfg = load_config(config)
        set_test_scale(cfg, scale)
        target = out / 'vis' / name / tag
        if name == 'detection':
            from mmdet.apis import DetInferencer
            inferencer = DetInferencer(model=cfg, weights=checkpoint, device='cpu', show_progress=False)
            inferencer([str(p) for p in val_images], out_dir=str(target), pred_score_thr=0.3, no_save_pred=True)
        else:
            from mmseg.apis import MMSegInferencer
            inferencer = MMSegInferencer(model=cfg, weights=checkpoint, device='cpu')
            inferencer([str(p) for p in val_images], out_dir=str(target), img_out_dir='vis')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='work_dirs/demo')
    parser.add_argument('--retrain', action='store_true')
    args = parser.parse_args()
    out = Path(args.out)
    start = time.perf_counter()
    print('[demo] data:', generate_shapes('data/shapes'))

    results = {}
    for name, task in TASKS.items():
        checkpoint = train(name, task['config'], out, args.retrain)
        results[name] = {}
        for label, scale, keep_ratio in TEST_SIZES:
            cfg = load_config(task['config'])
            set_test_scale(cfg, scale, keep_ratio)
            metrics = evaluate(cfg, checkpoint, str(out / name / 'eval'), f'{name}-{label}')
            value = metrics[task['metric']]
            results[name][label] = value / 100 if task['metric'] == 'mIoU' else value
            print(f'[demo] {name:<12} {label:<36} {task["label"]} = {results[name][label]:.3f}')
        visualise(name, task['config'], checkpoint, out)

    lines = ['| test resolution | ' + ' | '.join(t['label'] for t in TASKS.values()) + ' |',
             '|---|' + '---|' * len(TASKS)]
    for label, _, _ in TEST_SIZES:
        lines.append(f'| {label} | ' + ' | '.join(f'{results[n][label]:.3f}' for n in TASKS) + ' |')
    table = '\n'.join(lines)
    minutes = (time.perf_counter() - start) / 60
    (out / 'summary.md').write_text(table + f'\n\n{minutes:.1f} min in total\n')
    (out / 'summary.json').write_text(json.dumps(dict(results=results, minutes=minutes), indent=2))
    print('\n[demo] held-out split (150 images), models trained at short side <= 192 only:\n' + table)
    print(f'[demo] visualisations in {out / "vis"}; summary in {out / "summary.md"}; {minutes:.1f} min in total')


if __name__ == '__main__':
    main()
