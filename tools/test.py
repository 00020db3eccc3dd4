"""Evaluate a checkpoint with the config's test dataloader and evaluator (mmengine's Runner).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--cfg-options k=v ...]
                         [--engine ENGINE] [--precision P [--calibrate val|FOLDER] [--keep-fp32 MODULE ...]]

CHECKPOINT is an mmengine checkpoint of the config's model; for an ImageNet config (configs/imagenet) also
published weights by name (``pcpvt_small``: fetched once, checked), a URL or a weight file in any layout
``cpvt_backbones.convert`` reads, which is written once as that classifier's checkpoint. It must fit the model
exactly: a checkpoint with missing, unexpected or mis-shaped keys (another model's) is refused before its weights
are loaded, with every such key listed and the checkpoint and config named, and nothing is evaluated (exit
status 1; ``adapters.custom_hooks.strict_checkpoint``, the route ``tools/eval_sizes.py`` takes too), and so is
one with NaN or Inf weights (named by key) unless ``--allow-nonfinite``. Checkpoint files are read through
``cpvt_backbones.convert.safe_load`` (a pickle that would run code is refused; numpy 1.x's and numpy 2's names for
numpy's data types are both read). Such a refusal, a setting our backbone does not take (the valid ones listed)
and a weight file that cannot be fetched or read (missing, empty, truncated, corrupt: the file named) are one
line on stderr (exit status 1), not a traceback.

Once the checkpoint is loaded the model goes to ``--engine`` at ``--precision`` (``adapters.engines``; the table
at the end of ``--help`` says which engine runs which precision, covering what): by default ``fused``, our
backbone on the fused CPU kernels (same weights, same outputs to float32 rounding, faster); ``torch`` the plain
model (bf16: backbone, neck and head under autocast); ``openvino`` and ``onnxruntime`` backbone, neck and head
converted once and saved. int8 is calibrated on ``--calibrate`` images (by default the config's test set) through
the config's test pipeline, and what it derives is saved and reused. The data preprocessor, post-processing and
metrics stay the framework's.
"""
import argparse
import os

from cpvt_backbones.adapters.custom_hooks import strict_checkpoint, use_engine
from cpvt_backbones.adapters.engines import add_engine_args
from cpvt_backbones.adapters.runner import (
    ConfigError,
    add_common_args,
    build_runner,
    launched,
    load_config,
    quiet_known_warnings,
)
from cpvt_backbones.convert.loading import one_line_errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    add_common_args(parser)
    parser.add_argument('--allow-nonfinite', action='store_true',
                        help='evaluate a checkpoint with NaN or Inf weights (refused by default)')
    add_engine_args(parser)
    args = parser.parse_args()
    quiet_known_warnings()
    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in: mmengine reads checkpoints with safe_load)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))

    with one_line_errors('test.py', ConfigError):
        cfg = load_config(args.config, args.cfg_options, args.work_dir)
        strict_checkpoint(cfg, args.checkpoint, args.allow_nonfinite)
        use_engine(cfg, args)
        with launched(cfg, args.launcher):
            build_runner(cfg).test()


if __name__ == '__main__':
    main()
