"""The main demo: train a detector and a segmentor with pcpvt_tiny on the embedded shapes data, on CPU, and
test them at resolutions they never saw in training.

Steps: generate data/shapes; train RetinaNet from scratch, then Semantic FPN starting from the detector's
backbone (our stand-in for ImageNet pretraining, loaded through init_cfg=Pretrained), with mmengine's
progress logs; evaluate COCO bbox mAP (mmdet's CocoMetric) and mIoU (mmseg's IoUMetric) on the held-out
split at the training scale and at smaller, larger, odd-aspect and native sizes (most not divisible by 32);
draw predictions at unseen sizes under work_dirs/demo/vis; print and save a summary table
(work_dirs/demo/summary.{md,json}). A finished training run in work_dirs/demo is reused unless --retrain.
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
VIS_SIZES = [('0.7x', (.7, .7)), ('native', None), ('2x', (2., 2.))]


def scaled(cfg, factors):
    """Resize target (W, H) for factors of the config's training scale (long side)."""
    return None if factors is None else tuple(round(s * f) for s, f in zip(cfg.train_scale, factors))


def train(name: str, config: str, out: Path, retrain: bool, init_from: str = None) -> str:
    cfg = load_config(config, work_dir=str(out / name))
    if init_from is not None:
        cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=init_from, prefix='backbone.')
    cfg.train_cfg.val_interval = cfg.train_cfg.max_iters + 1  # evaluated below, at every test size
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
    for tag, factors in VIS_SIZES:
        cfg = load_config(config)
        set_test_scale(cfg, scaled(cfg, factors))
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

    results, checkpoint = {}, None
    for name, task in TASKS.items():
        checkpoint = train(name, task['config'], out, args.retrain, init_from=checkpoint)
        results[name] = {}
        for label, factors, keep_ratio in TEST_SIZES:
            cfg = load_config(task['config'])
            set_test_scale(cfg, scaled(cfg, factors), keep_ratio)
            metrics = evaluate(cfg, checkpoint, str(out / name / 'eval'), f'{name}-{label}')
            value = metrics[task['metric']]
            results[name][label] = float(value) / 100 if task['metric'] == 'mIoU' else float(value)
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
    print('\n[demo] held-out split (150 images); training scale (long side): detection 192, segmentation 160\n'
          + table)
    print(f'[demo] visualisations in {out / "vis"}; summary in {out / "summary.md"}; {minutes:.1f} min in total')


if __name__ == '__main__':
    main()
