"""Which layers cost the demo's models accuracy in int8: the trained demo detector (or segmentor) evaluated at
every demo test size in torch float32 and on OpenVINO int8 (NNCF, calibrated as the demo does: 32 training
images through the test pipeline) with each candidate part of the model kept in float32 (``keep_fp32``,
NNCF's ignored scope).

    python -m benchmarks.int8_scope [--task detection|segmentation] [--demo-dir work_dirs/demo]
        [--scopes none backbone neck bbox_head ...] [--json PATH]

A scope is 'none' (everything quantized) or '+'-joined module names of the model ('bbox_head.retina_cls+
bbox_head.retina_reg'). Needs the demo's trained checkpoints (``make demo``). Writes a table of each scope's
score and its largest deviation from float32 over the sizes.
"""
import argparse
import json
import time
from pathlib import Path

from benchmarks.study.common import run_meta
from cpvt_backbones.adapters.evaluation import evaluate, headline_score, set_test_scale
from cpvt_backbones.adapters.runner import load_config, quiet_known_warnings
from cpvt_backbones.adapters.shapes_tasks import CALIBRATION, SHAPES_TASKS, TEST_SIZES, scaled

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_SCOPES = {
    'detection': ['none', 'backbone', 'neck', 'bbox_head', 'bbox_head.retina_cls+bbox_head.retina_reg',
                  'backbone.patch_embeds.0'],
    'segmentation': ['none', 'backbone', 'neck', 'decode_head'],
}


def scores(task: str, checkpoint: str, work_dir: Path, engine: str, precision: str, keep_fp32=()) -> dict:
    """The headline score (a fraction) at every demo test size."""
    spec = SHAPES_TASKS[task]
    out = {}
    for label, factors, keep_ratio in TEST_SIZES:
        cfg = load_config(str(ROOT / spec.config))
        set_test_scale(cfg, scaled(cfg, factors), keep_ratio)
        metrics = evaluate(cfg, checkpoint, str(work_dir), f'{task}-{label}-{engine}-{precision}', precision,
                           engine=engine, calibration_source=str(ROOT / CALIBRATION) if precision == 'int8' else None,
                           calibration_images=32, keep_fp32=keep_fp32 if precision == 'int8' else None)
        out[label] = headline_score(spec.scope, metrics) / 100
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--task', choices=sorted(SHAPES_TASKS), default='detection')
    parser.add_argument('--demo-dir', default=str(ROOT / 'work_dirs/demo'))
    parser.add_argument('--scopes', nargs='+', help='default: per task, see DEFAULT_SCOPES')
    parser.add_argument('--json', help='write the results here')
    args = parser.parse_args(argv)
    quiet_known_warnings()
    start = time.perf_counter()
    config = load_config(str(ROOT / SHAPES_TASKS[args.task].config))
    checkpoint = Path(args.demo_dir) / args.task / f'iter_{config.train_cfg.max_iters}.pth'
    if not checkpoint.is_file():
        raise SystemExit(f'no trained demo {args.task} at {checkpoint}: run `make demo` first')
    work_dir = Path(args.demo_dir) / args.task / 'int8_scope'
    reference = scores(args.task, str(checkpoint), work_dir, 'torch', 'fp32')
    rows = []
    for scope in args.scopes or DEFAULT_SCOPES[args.task]:
        keep = () if scope == 'none' else tuple(scope.split('+'))
        got = scores(args.task, str(checkpoint), work_dir, 'openvino', 'int8', keep)
        worst = max(abs(got[k] - reference[k]) for k in reference)
        rows.append(dict(scope=scope, scores=got, worst=worst))
        print(f'[int8-scope] {scope}: largest deviation from torch fp32 {worst:.3f}', flush=True)
    labels = [label for label, _, _ in TEST_SIZES]
    lines = ['| float32 (OpenVINO int8 elsewhere) | ' + ' | '.join(labels) + ' | largest deviation |',
             '|---|' + '---|' * (len(labels) + 1),
             '| (torch fp32) | ' + ' | '.join(f'{reference[k]:.3f}' for k in labels) + ' | - |']
    lines += [f'| {r["scope"]} | ' + ' | '.join(f'{r["scores"][k]:.3f}' for k in labels) + f' | {r["worst"]:.3f} |'
              for r in rows]
    print('\n'.join(lines))
    result = dict(run_meta('benchmarks.int8_scope', argv, start), task=args.task, checkpoint=str(checkpoint),
                  reference=reference, rows=rows, table='\n'.join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == '__main__':
    main()
