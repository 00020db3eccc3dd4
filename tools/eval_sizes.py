"""Evaluate one checkpoint at several test resolutions without fine-tuning; write a table and a plot.

    python tools/eval_sizes.py CONFIG CHECKPOINT [--sizes 224 384 448 512] [--out DIR] [--name NAME]
                                     [--cfg-options k=v ...] [--allow-nonfinite]

Classifiers (mmpretrain configs) are tested at SIZE x SIZE: short side resized to SIZE / crop_ratio, centre
crop SIZE (the config's ``crop_ratio`` and default sizes ``test_resolutions``). Detectors and segmentors
(mmdet/mmseg configs) resize the long side to SIZE, keeping the aspect ratio. Sizes are whole pixels, at least 1.
Writes OUT/NAME.csv, OUT/NAME.json and OUT/NAME.png (metric against test size), each whole or not at all
(``cpvt_backbones.utils.atomic_path``).

CHECKPOINT is loaded as ``tools/test.py`` loads it (``adapters.evaluation.evaluate``, through
``adapters.custom_hooks.strict_checkpoint``): one that does not fit the config's model exactly (another model's)
or holds NaN or Inf weights (unless ``--allow-nonfinite``) is refused before anything is evaluated, and nothing is
written; that, a file that cannot be read (missing, empty, truncated, corrupt) and a setting our backbone does not
take are one line on stderr naming the file, key or setting (exit status 1).
"""
import argparse
import csv
import io
import json
from pathlib import Path

from mmengine.config import DictAction

from cpvt_backbones.adapters.evaluation import METRICS, evaluate, headline_score, set_cls_test_size, set_test_scale
from cpvt_backbones.adapters.runner import ConfigError, load_config, quiet_known_warnings
from cpvt_backbones.convert.loading import one_line_errors
from cpvt_backbones.utils import atomic_path, atomic_write, pyplot


def pixel_size(text: str) -> int:
    """A test size in pixels: a whole number, at least 1."""
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'a test size is a whole number of pixels, got {text!r}') from None
    if size < 1:
        raise argparse.ArgumentTypeError(f'a test size must be at least 1 pixel, got {size}')
    return size


def sweep(config: str, checkpoint: str, sizes, work_dir: Path, name: str, cfg_options=None,
          allow_nonfinite: bool = False):
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
        metrics = evaluate(cfg, checkpoint, str(work_dir / 'eval'), f'{name}-{size}',
                           allow_nonfinite=allow_nonfinite)
        rows.append(dict(size=size, metric=headline_score(scope, metrics)))
        print(f'[sweep] {name} @ {size}: {METRICS[scope].label} = {rows[-1]["metric"]:.2f}')
    return rows, METRICS[scope]


def write(rows, metric, out: Path, name: str) -> None:
    """OUT/NAME.csv, .json and .png, each whole or not at all."""
    table = io.StringIO(newline='')
    writer = csv.DictWriter(table, fieldnames=['size', 'metric'])
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(out / f'{name}.csv', table.getvalue().encode())
    atomic_write(out / f'{name}.json', json.dumps(dict(metric=metric.key, percent=True, rows=rows), indent=2).encode())
    plot({name: rows}, metric.label, out / f'{name}.png')


def plot(curves, ylabel: str, path: Path) -> None:
    """One line per name in ``curves`` ({name: rows}), saved to ``path`` whole or not at all."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for label, rows in curves.items():
        ax.plot([r['size'] for r in rows], [r['metric'] for r in rows], marker='o', label=label)
    ax.set_xlabel('test resolution (px)')
    ax.set_ylabel(ylabel)
    ax.grid(alpha=.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--sizes', type=pixel_size, nargs='+', help="default: the config's test_resolutions")
    parser.add_argument('--out', default='work_dirs/eval_sizes')
    parser.add_argument('--name', help='file stem (default: the config name)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    parser.add_argument('--allow-nonfinite', action='store_true',
                        help='evaluate a checkpoint with NaN or Inf weights (refused by default)')
    args = parser.parse_args()
    quiet_known_warnings()
    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in: mmengine reads checkpoints with safe_load)
    with one_line_errors('eval_sizes.py', ConfigError):
        sizes = args.sizes or load_config(args.config).get('test_resolutions')
        if not sizes:
            raise SystemExit('give --sizes: the config has no test_resolutions')
        name = args.name or Path(args.config).stem
        out = Path(args.out)
        rows, metric = sweep(args.config, args.checkpoint, sizes, out, name, args.cfg_options, args.allow_nonfinite)
    try:
        write(rows, metric, out, name)
    except OSError as e:
        raise SystemExit(f'eval_sizes.py: cannot write the results under {out} ({e.strerror or e}: '
                         f'{e.filename or out}); choose another --out') from None
    print(f'[sweep] wrote {out / name}.csv, .json, .png')


if __name__ == '__main__':
    main()
