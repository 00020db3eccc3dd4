"""Evaluate a checkpoint with the config's test dataloader and evaluator (mmengine's Runner).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--cfg-options k=v ...]
                         [--engine torch|openvino] [--plain | --precision P [--calibrate val|FOLDER]]

CHECKPOINT is an mmengine checkpoint of the config's model; for an ImageNet config (configs/imagenet) also
published weights by name (``pcpvt_small``: fetched once, checked), a URL or a weight file in any layout
``cpvt_backbones.convert`` reads, which is written once as that classifier's checkpoint. It must fit the model
exactly: a checkpoint with missing, unexpected or mis-shaped keys (another model's) is refused before its weights
are loaded, with every such key listed and the checkpoint and config named, and nothing is evaluated (exit
status 1; ``adapters.hooks.StrictLoadHook``). Checkpoint files are read through ``cpvt_backbones.convert.
safe_load`` (a pickle that would run code is refused).

Our backbones run optimized (``cpvt_backbones.optimize``: same weights, same outputs to float32 rounding,
faster on a CPU), in float32 or, with ``--precision int8``, on int8 copies of the weights (activations at ranges
calibrated once on ``--calibrate`` images, by default the config's test set, and saved); ``--precision bf16``
runs backbone, neck and head under torch's bf16 autocast, post-processing in float32; ``--plain`` keeps the
plain model (for hooks on its inner layers). ``--engine openvino`` runs the
detector's or segmentor's backbone, neck and head on OpenVINO instead (fp32, bf16, or int8 through NNCF,
calibrated on ``--calibrate`` images, by default the config's test set; the converted model is saved and reused),
with the data preprocessor, post-processing and metrics unchanged.
"""
import argparse
import os

from cpvt_backbones.adapters.engines import add_precision_args, apply_precision
from cpvt_backbones.adapters.runner import (add_common_args, build_runner, launched, load_config, quiet_known_warnings,
                                            runner_checkpoint, strict_loading)
from cpvt_backbones.convert import CheckpointMismatchError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    add_common_args(parser)
    add_precision_args(parser)
    args = parser.parse_args()
    quiet_known_warnings()
    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in: mmengine reads checkpoints with safe_load)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))

    cfg = load_config(args.config, args.cfg_options, args.work_dir)
    cfg.load_from = runner_checkpoint(cfg, args.checkpoint)
    apply_precision(cfg, args, cfg.load_from)
    strict_loading(cfg)
    try:
        with launched(cfg, args.launcher):
            build_runner(cfg).test()
    except CheckpointMismatchError as e:
        raise SystemExit(f'test.py: {e}')


if __name__ == '__main__':
    main()
