"""Train a detector, segmentor or classifier from a config with mmengine's Runner.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp] [--cfg-options k=v ...]
    torchrun --nproc_per_node=N tools/train.py CONFIG --launcher pytorch     (tools/dist_train.sh; CPU: gloo)
"""
import argparse
import os

from cpvt_backbones.adapters.runner import (
    ConfigError,
    add_common_args,
    build_runner,
    enable_amp,
    launched,
    load_config,
    quiet_known_warnings,
)
from cpvt_backbones.convert.loading import one_line_errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('--resume', nargs='?', const='auto',
                        help='continue from CKPT, or (no value) from the last checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true', help='mixed-precision training (GPU only)')
    add_common_args(parser)
    args = parser.parse_args()
    quiet_known_warnings()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))

    with one_line_errors('train.py', ConfigError):
        cfg = load_config(args.config, args.cfg_options, args.work_dir)
    if args.amp:
        enable_amp(cfg)
    if args.resume:
        cfg.resume = True
        cfg.load_from = None if args.resume == 'auto' else args.resume
    with launched(cfg, args.launcher):
        build_runner(cfg).train()


if __name__ == '__main__':
    main()
