"""Evaluate a checkpoint with the config's test dataloader and evaluator (mmengine's Runner).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--cfg-options k=v ...] [--plain | --precision P]

CHECKPOINT is an mmengine checkpoint of the config's model; for an ImageNet config (configs/imagenet) also
published weights by name (``pcpvt_small``: fetched once, checked), a URL or a weight file in any layout
``cpvt_backbones.convert`` reads, which is written once as that classifier's checkpoint.

Our backbones run optimized (``cpvt_backbones.optimize``: same weights, same outputs to float32 rounding,
faster on a CPU), in float32 or, with ``--precision bf16|int8``, on bf16 or int8 copies of the weights;
``--plain`` keeps the plain model (for hooks on its inner layers).
"""
import argparse
import os

from mmengine.runner import Runner

from cpvt_backbones.adapters.runtime import (add_common_args, launched, load_config, optimize_backbone,
                                            quiet_known_warnings, runner_checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    add_common_args(parser)
    parser.add_argument('--plain', action='store_true', help='do not optimize our backbone')
    parser.add_argument('--precision', choices=('fp32', 'bf16', 'int8'), default='fp32',
                        help="our optimized backbone's precision (cpvt_backbones.optimize)")
    args = parser.parse_args()
    quiet_known_warnings()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))

    cfg = load_config(args.config, args.cfg_options, args.work_dir)
    cfg.load_from = runner_checkpoint(cfg, args.checkpoint)
    if not args.plain:
        optimize_backbone(cfg, args.precision)
    with launched(cfg, args.launcher):
        Runner.from_cfg(cfg).test()


if __name__ == '__main__':
    main()
