"""Evaluate one checkpoint at several test resolutions without fine-tuning; write a table and a plot.

    python tools/eval_sizes.py CONFIG CHECKPOINT [--sizes 224 384 448 512] [--out DIR] [--name NAME]
                                     [--cfg-options k=v ...]

Classifiers (mmpretrain configs) are tested at SIZE x SIZE: short side resized to SIZE / crop_ratio, centre
crop SIZE (the config's ``crop_ratio`` and default sizes ``test_resolutions``). Detectors and segmentors
(mmdet/mmseg configs) resize the long side to SIZE, keeping the aspect ratio. Writes OUT/NAME.csv,
OUT/NAME.json and OUT/NAME.png (metric against test size).
"""
import argparse
import csv
import json
from pathlib import Path

from mmengine.config import DictAction

from cpvt_backbones.adapters.evaluation import METRICS, evaluate, headline_score, set_cls_test_size, set_test_scale
from cpvt_backbones.adapters.runner import load_config, quiet_known_warnings
from cpvt_backbones.utils import pyplot


def sweep(config: str, checkpoint: str, sizes, work_dir: Path, name: str, cfg_options=None):
    """[{'size': s, 'metric': value}] for each size."""
    rows = []
    for size in sizes:
        cfg = load_config(config, cfg_options)
        scope = cfg.get('default_scope')
        if scope not in METRICS:
            raise SystemExit(f'{config}: default_scope {scope!r} is not one of {sorted(METRICS)}')
        if scope == 'mmpretrain':
            set_cls_test_size(cfg, size)
        else:
            set_test_scale(cfg, (size, size))
        metrics = evaluate(cfg, checkpoint, str(work_dir / 'eval'), f'{name}-{size}')
        rows.append(dict(size=size, metric=headline_score(scope, metrics)))
        print(f'[sweep] {name} @ {size}: {METRICS[scope].label} = {rows[-1]["metric"]:.2f}')
    return rows, METRICS[scope]


def write(rows, metric, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f'{name}.csv', 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=['size', 'metric'])
        writer.writeheader()
        writer.writerows(rows)
    (out / f'{name}.json').write_text(json.dumps(dict(metric=metric.key, percent=True, rows=rows), indent=2))
    plot({name: rows}, metric.label, out / f'{name}.png')


def plot(curves, ylabel: str, path: Path) -> None:
    """One line per name in ``curves`` ({name: rows})."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for label, rows in curves.items():
        ax.plot([r['size'] for r in rows], [r['metric'] for r in rows], marker='o', label=label)
    ax.set_xlabel('test resolution (px)')
    ax.set_ylabel(ylabel)
    ax.grid(alpha=.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--sizes', type=int, nargs='+', help="default: the config's test_resolutions")
    parser.add_argument('--out', default='work_dirs/eval_sizes')
    parser.add_argument('--name', help='file stem (default: the config name)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args()
    quiet_known_warnings()
    sizes = args.sizes or load_config(args.config).get('test_resolutions')
    if not sizes:
        raise SystemExit('give --sizes: the config has no test_resolutions')
    name = args.name or Path(args.config).stem
    out = Path(args.out)
    rows, metric = sweep(args.config, args.checkpoint, sizes, out, name, args.cfg_options)
    write(rows, metric, out, name)
    print(f'[sweep] wrote {out / name}.csv, .json, .png')


if __name__ == '__main__':
    main()
