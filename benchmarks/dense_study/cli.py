"""The study's command line: this shard's runs trained and tested, then, once every run of the grid is done, the
report (``main``)."""
import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks import dense_study
from benchmarks.dense_study.design import (
    DEFAULT_FACTORS,
    FACTORS,
    ROOT,
    STUDIED,
    TASKS,
    VARIANTS,
    DenseStudyConfig,
    run,
)
from benchmarks.dense_study.render import report
from benchmarks.study.common import parse_shard, study_dir
from benchmarks.study.grid import Grid, conduct
from cpvt_backbones.adapters.runner import quiet_known_warnings


def parse_args(argv: Sequence[str] | None = None) -> DenseStudyConfig:
    p = argparse.ArgumentParser(prog='python -m benchmarks.dense_study', description=dense_study.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument('--shard', default='0/1',
                   help='K/N: run every N-th (seed, variant), both tasks of it, from the K-th (0-based)')
    p.add_argument('--work-dir', type=Path, default=study_dir('dense_study'))
    p.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results')
    p.add_argument('--name', default='dense_study')
    args = p.parse_args(argv)
    shard_index, num_shards = parse_shard(p, args.shard)
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()}  # immutable throughout
    del options['shard']
    return DenseStudyConfig(**options, shard_index=shard_index, num_shards=num_shards)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """This shard's runs, then (once every run is done) the report; its summary rows, or [] while runs of other
    shards are pending."""
    settings = parse_args(argv)
    quiet_known_warnings()
    from cpvt_backbones.datasets import ShapesSpec, generate_shapes
    generate_shapes(settings.data, ShapesSpec(num_train=settings.num_train, num_val=settings.num_val))
    work = settings.work_dir

    def run_pair(key: tuple[int, str]) -> list[dict]:  # a segmentor may start from the same pair's detector
        seed, variant = key
        return [run(task, variant, seed, settings, work / f'{task}-{variant}-seed{seed}') for task in settings.tasks]
    grid = Grid([(seed, variant) for seed in settings.seeds for variant in settings.variants],
                lambda k: [work / f'{t}-{k[1]}-seed{k[0]}' for t in settings.tasks],
                settings.shard_index, settings.num_shards)
    return conduct(grid, 'dense', 'benchmarks.dense_study', argv, lambda todo: [run_pair(k) for k in todo],
                   run_pair, lambda results, meta: report(results, settings, meta)) or []
