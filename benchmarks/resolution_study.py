"""CPVT's position-encoding comparison and its resolution test, on real images (Fashion-MNIST).

    python -m benchmarks.resolution_study --name NAME [--variants ...] [--head cls|gap] [--image-size 14 --patch 2
        --test-sizes 14 20 28 42] [--seeds 0 1 2] [--shard K/N] [--out DIR]

One DeiT-style ``CPVT`` (``--depth`` blocks, ``--dim`` wide, patch ``--patch``, a class token or global average
pooling, ``--head``) is trained from scratch once per position encoding in ``VARIANTS`` (the rows of the
paper's ablation table, plus 2-D RoPE), with the same data subset, schedule, augmentation and seeds.

Training images are random resized crops (area ``--crop-scale``..1, aspect 3/4..4/3, flips) of the 28 px
originals, resampled to ``--image-size``; tests are the whole test images resized to ``--test-sizes``. Two
protocols follow from the sizes:

* ``--image-size 14 --patch 2`` (the paper's ImageNet protocol): training below the originals' resolution,
  so testing at 20 px (1.43x) and 28 px (2x) shows real extra detail, as ImageNet's 384 px tests do, and
  random crops make training objects look larger than in a whole test image (the FixRes effect); 42 px (3x)
  is upsampled;
* ``--image-size 28 --patch 4``: training at the originals' resolution, so every larger test is upsampled
  (no new detail, objects only cover more tokens).

Diagnostics, from the same models: a linear position probe (``position_probe``: how well relative token
position can be read from the final features at each test size), the first PEG's response on a blank and a
real image, and optionally the images centred on blank canvases (``--canvas-sizes``) and placed at 3 x 3
positions on one (``--placement-canvas``).

The study is ``benchmarks.study`` (config, data, test specifications, trainer, report); this module is its
command line, and ``run_study`` runs a ``StudyConfig`` (``benchmarks.recipe_sweep`` runs its recipes so).

Resumable: every run (variant, seed) keeps a checkpoint per epoch and a result.json under --work-dir/NAME; a
rerun continues an interrupted run from its last epoch, skips finished ones, and runs only the tests a finished
run lacks (on its saved weights). ``--shard K/N`` takes every N-th run from the K-th (0-based), so N
single-thread processes can share a study; the outputs are written by whichever invocation finds every run
finished. Writes NAME.{json,csv,md,png} and NAME_{probe,peg_response[,placement]}.png under --out with the
per-seed numbers, mean and standard deviation, the paper's figure per variant, the command and the wall time.
"""

import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks.study.common import parse_shard
from benchmarks.study.config import CROP_AREA, CROP_RESAMPLE, TEST_RESAMPLE, TF32, VARIANTS, StudyConfig, command_args
from benchmarks.study.data import ensure_data, load_split
from benchmarks.study.grid import Grid, conduct
from benchmarks.study.report import StudyReport, plot_peg_response, trained_on
from benchmarks.study.trainer import run


def parse_args(argv: Sequence[str] | None = None) -> StudyConfig:
    d = StudyConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', type=Path, default=d.data, help='directory with the Fashion-MNIST IDX files')
    p.add_argument('--variants', nargs='+', default=list(d.variants), choices=list(VARIANTS),
                   help='default: every ViT variant (cnn, the control, only when named)')
    p.add_argument('--head', choices=('cls', 'gap'), default=d.head, help='class token, or global average pooling')
    p.add_argument('--shard', default='0/1', help='K/N: run every N-th (variant, seed) from the K-th (0-based)')
    p.add_argument('--seeds', type=int, nargs='+', default=list(d.seeds))
    p.add_argument('--train-images', type=int, default=d.train_images, help='a fixed random subset of the 60,000')
    p.add_argument('--test-images', type=int, default=d.test_images, help='the first N of the 10,000')
    p.add_argument('--image-size', type=int, default=d.image_size,
                   help='training resolution (the originals are 28 px)')
    p.add_argument('--test-sizes', type=int, nargs='+', default=list(d.test_sizes))
    p.add_argument('--canvas-sizes', type=int, nargs='*', default=list(d.canvas_sizes),
                   help='also test the training-size images centred on blank canvases of these sizes')
    p.add_argument('--placement-canvas', type=int, default=d.placement_canvas,
                   help='accuracy by position: the images placed at 3 x 3 positions on a canvas this large '
                        '(0: skip)')
    p.add_argument('--placement-images', type=int, default=d.placement_images,
                   help='the first N test images, per position')
    p.add_argument('--probe-images', type=int, default=d.probe_images,
                   help='position probe: fitted on the first half of the first N test images at the training size, '
                        'scored on the second half at every test size (0: skip)')
    p.add_argument('--epochs', type=int, default=d.epochs)
    p.add_argument('--batch-size', type=int, default=d.batch_size)
    p.add_argument('--lr', type=float, default=d.lr)
    p.add_argument('--warmup', type=float, default=d.warmup,
                   help='the linear warm-up\'s share of the steps (then cosine decay)')
    p.add_argument('--weight-decay', type=float, default=d.weight_decay)
    p.add_argument('--drop-path', type=float, default=d.drop_path)
    p.add_argument('--crop-scale', type=float, default=d.crop_scale,
                   help='smallest crop area of the random resized crop')
    p.add_argument('--crop-resample', choices=CROP_RESAMPLE, default=d.crop_resample,
                   help='how training crops are resampled: antialiased when shrinking, as ImageNet pipelines do, '
                        'or one bilinear sample per pixel (aliased)')
    p.add_argument('--crop-area', choices=CROP_AREA, default=d.crop_area,
                   help="how crop areas are drawn: uniform in crop-scale..1 (ImageNet's) or log-uniform")
    p.add_argument('--stem', action='store_true',
                   help='a convolutional stem (circular padding, stride 2 per layer) instead of the patch embedding')
    p.add_argument('--stem-layers', type=int, default=d.stem_layers,
                   help='3 x 3 stride-1 layers the stem adds after its stride-2 ones (with --stem)')
    p.add_argument('--stem-norm', action='store_true',
                   help='BatchNorm after every convolution of the stem (with --stem)')
    p.add_argument('--blur-up', type=float, default=d.blur_up,
                   help='the share of training crops shrunk to image-size^2 / S px and resized back, S drawn from '
                        'the test sizes above the training size: a drawing upsampled as a resized test is')
    p.add_argument('--test-resample', choices=TEST_RESAMPLE, default=d.test_resample,
                   help='how test images are resized (antialiased when shrinking); a test-time choice: a study '
                        'that only changes it can reuse another\'s trained runs (--runs)')
    p.add_argument('--decay-position', action='store_true',
                   help='weight decay on the position encodings\' weights too (by default they are exempt, as in '
                        'DeiT, Twins and RoPE-ViT)')
    p.add_argument('--dim', type=int, default=d.dim)
    p.add_argument('--depth', type=int, default=d.depth)
    p.add_argument('--heads', type=int, default=d.heads)
    p.add_argument('--patch', type=int, default=d.patch)
    p.add_argument('--device', default=d.device, help='torch device to train and test on (cpu, cuda, ...)')
    p.add_argument('--tf32', choices=TF32, default=d.tf32,
                   help="TF32 in CUDA matrix products and cuDNN convolutions: 'on' (both), 'off' (neither: full "
                        "float32, as on a CPU), or PyTorch's default (cuDNN's on, the matrix products' off); "
                        'recorded in each result')
    p.add_argument('--work-dir', type=Path, default=d.work_dir, help='runs go to WORK_DIR/RUNS/')
    p.add_argument('--out', type=Path, default=d.out)
    p.add_argument('--name', default=d.name, help='name of the outputs (and of the runs by default)')
    p.add_argument('--runs', default=None,
                   help='directory name of the trained runs under --work-dir (default: --name); studies that '
                        'differ only in test-time options share runs')
    args = p.parse_args(argv)
    shard_index, num_shards = parse_shard(p, args.shard)
    options = vars(args)
    del options['shard']
    try:
        return StudyConfig(**options, shard_index=shard_index, num_shards=num_shards)
    except ValueError as e:
        p.error(str(e))


def run_study(config: StudyConfig, command: Sequence[str] | None = None) -> list[dict]:
    """Train and test this shard's runs of ``config``; once every run of the study has finished, write its
    report and return its rows ([] while runs of other shards are pending). ``command``: the options the meta
    records (default: those that give ``config``)."""
    ensure_data(config.data)
    data = (load_split(config.data, 'train', config.train_images),
            load_split(config.data, 'test', config.test_images))
    grid = Grid([(v, seed) for seed in config.seeds for v in config.variants], lambda k: [config.run_dir(*k)],
                config.shard_index, config.num_shards)

    def load(key: tuple[str, int]) -> list[dict]:
        return [run(*key, config, data, config.run_dir(*key))]

    def report(results: list[dict], meta: dict) -> list[dict]:
        meta = dict(meta, dataset='Fashion-MNIST', train_images=config.train_images, test_images=config.test_images,
                    image_size=config.image_size, test_sizes=list(config.test_sizes),
                    canvas_sizes=list(config.canvas_sizes), seeds=list(config.seeds), epochs=config.epochs,
                    iterations=results[0]['iterations'], batch_size=config.batch_size, lr=config.lr,
                    weight_decay=config.weight_decay, drop_path=config.drop_path, crop_scale=config.crop_scale,
                    crop_resample=config.crop_resample, test_resample=config.test_resample,
                    decay_position=config.decay_position, device=config.device, tf32=config.tf32,
                    trained_on=trained_on(results), runs=config.run_set,
                    model=dict(dim=config.dim, depth=config.depth, heads=config.heads, patch=config.patch,
                               head=config.head),
                    params={r['variant']: r['params'] for r in results},
                    run_minutes=round(sum(r['train_seconds'] + r['eval_seconds'] for r in results) / 60, 1),
                    train_minutes=round(sum(r['train_seconds'] for r in results) / 60, 1),
                    test_minutes=round(sum(r['eval_seconds'] for r in results) / 60, 1))
        study = StudyReport(config, results, meta)
        study.write()
        if any(v in config.variants for v in ('peg_0', 'peg_0-5', 'peg_-1_wide')):
            plot_peg_response(config, data[1][0][:1], config.out / f'{config.name}_peg_response.png')
        print(f'[study] {meta["wall_minutes"]} min; results in {config.out}')
        return study.rows
    return conduct(grid, 'study', 'benchmarks.resolution_study', command_args(config) if command is None else command,
                   lambda todo: [load(key) for key in todo], load, report) or []


def main(argv: Sequence[str] | None = None) -> list[dict]:
    return run_study(parse_args(argv), argv)


if __name__ == '__main__':
    main()
