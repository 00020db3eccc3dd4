"""CPVT's central claim at small scale: train one network three ways at one resolution, test at larger ones.

    python benchmarks/resolution_study.py [--iters 1500] [--seeds 0 1] [--out benchmarks/results]

On the embedded shape crops (data/shapes_cls, 64 x 64), cpvt_tiny_gap is trained from scratch with
(a) PEG after blocks 0-5 (CPVT), (b) no PEG but DeiT's learned absolute position embedding, bicubically
interpolated at test time, (c) no position encoding at all; everything else (data, schedule, seed) equal.
Each is tested without fine-tuning at 1x, 1.5x, 2x and 2.5x the training resolution (images resized, the
token grid grows from 4 x 4 to 10 x 10). Writes resolution_study.{csv,json,md,png} under --out.
"""
import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))

from mmengine.runner import Runner  # noqa: E402
from resolution_sweep import plot, sweep  # noqa: E402

from cpvt_backbones.adapters.runtime import load_config  # noqa: E402
from cpvt_backbones.datasets import generate_shape_crops  # noqa: E402

CONFIG = str(ROOT / 'configs/shapes/cpvt-tiny-gap_shapes-cls.py')
TRAIN_SIZE = 64
FACTORS = (1, 1.5, 2, 2.5)
VARIANTS = {
    'PEG (CPVT)': dict(base='cpvt_tiny_gap'),
    'learned abs. PE, interpolated (DeiT)': dict(base='cpvt_tiny_gap', peg_positions=(), pos_embed_grid=(4, 4)),
    'no position encoding': dict(base='cpvt_tiny_gap', peg_positions=()),
}


def train(label: str, arch: dict, seed: int, iters: int, work_dir: Path) -> str:
    cfg = load_config(CONFIG, work_dir=str(work_dir))
    cfg.model.backbone.arch = arch
    cfg.randomness = dict(seed=seed, deterministic=False)
    cfg.train_cfg.max_iters = cfg.train_cfg.val_interval = iters
    cfg.param_scheduler[1].T_max = iters - cfg.param_scheduler[1].begin
    cfg.param_scheduler[1].end = iters
    cfg.default_hooks.checkpoint.interval = iters
    cfg.log_level = 'WARNING'
    final = work_dir / f'iter_{iters}.pth'
    if not final.is_file():
        start = time.perf_counter()
        Runner.from_cfg(cfg).train()
        print(f'[study] {label} seed {seed}: {iters} iterations in {time.perf_counter() - start:.0f} s', flush=True)
    return str(final)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--iters', type=int, default=1500)
    parser.add_argument('--seeds', type=int, nargs='+', default=[0])
    parser.add_argument('--out', default=str(ROOT / 'benchmarks/results'))
    parser.add_argument('--work-dir', default='work_dirs/resolution_study')
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work_dir)
    generate_shape_crops(ROOT / 'data/shapes_cls')
    sizes = [round(TRAIN_SIZE * f) for f in FACTORS]
    start = time.perf_counter()

    rows, curves = [], {}
    for label, arch in VARIANTS.items():
        per_seed = []
        for seed in args.seeds:
            tag = f'{label.split()[0].lower()}-seed{seed}'
            checkpoint = train(label, arch, seed, args.iters, work / tag)
            per_seed.append(sweep(CONFIG, checkpoint, sizes, work / tag, tag,
                                  {'model.backbone.arch': dict(arch, _delete_=True)})[0])
        means = [statistics.mean(r[i]['metric'] for r in per_seed) for i in range(len(sizes))]
        curves[label] = [dict(size=s, metric=m) for s, m in zip(sizes, means)]
        for i, size in enumerate(sizes):
            rows.append(dict(variant=label, size=size, factor=FACTORS[i], top1_mean=round(means[i], 2),
                             top1_per_seed=[round(r[i]['metric'], 2) for r in per_seed]))
    minutes = (time.perf_counter() - start) / 60

    out.mkdir(parents=True, exist_ok=True)
    with open(out / 'resolution_study.csv', 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    meta = dict(config='configs/shapes/cpvt-tiny-gap_shapes-cls.py', train_size=TRAIN_SIZE, iters=args.iters,
                seeds=args.seeds, minutes=round(minutes, 1))
    (out / 'resolution_study.json').write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    header = '| variant | ' + ' | '.join(f'{s} px ({f}x)' for s, f in zip(sizes, FACTORS)) + ' |'
    lines = [header, '|---|' + '---|' * len(sizes)]
    for label, curve in curves.items():
        lines.append(f'| {label} | ' + ' | '.join(f'{p["metric"]:.1f}' for p in curve) + ' |')
    table = '\n'.join(lines)
    (out / 'resolution_study.md').write_text(
        table + f'\n\ntop-1 (%) on 400 held-out crops; trained at {TRAIN_SIZE} px for {args.iters} iterations, '
        f'seeds {args.seeds}; {minutes:.0f} min on this machine\n')
    plot(curves, 'top-1 accuracy (%)', out / 'resolution_study.png', TRAIN_SIZE)
    print(table)
    print(f'[study] {minutes:.1f} min; results in {out}')


if __name__ == '__main__':
    main()
