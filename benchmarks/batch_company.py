"""Does an image's score depend on the images it is batched with? The demo's trained detectors and segmentors
evaluated one image at a time and in padded batches two ways: the configs' (each image predicted as alone: the
valid-size data preprocessors and type 'PredictAlone') and the frameworks' own (mmdet's data preprocessor and
predict; mmseg's own refuses a test batch of images of different sizes, so it has no such column).

    python -m benchmarks.batch_company [--out work_dirs/demo] [--tasks ...] [--sizes ...] [--batch-size 8]
                                       [--name NAME]

Needs the demo's trained checkpoints in ``--out`` (``make demo``, or ``tools/demo.py --out DIR``). Writes
benchmarks/results/NAME.{json,md} (default ``batch_company_<ISA>``): per task and test size the headline score
at batch 1, at ``--batch-size`` as alone and at ``--batch-size`` the frameworks' way, with each evaluation's wall
time, the ISA and the command.
"""
import argparse
import copy
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks.study.grid import write_report
from cpvt_backbones.adapters.shapes_tasks import DEMO_TASKS, SCORES, TEST_SIZES, final_checkpoint, scaled
from cpvt_backbones.utils import cpu_info

RESULTS = Path(__file__).resolve().parent / 'results'


def frameworks_own(cfg) -> bool:
    """``cfg`` with the framework's own model type and data preprocessor (a padded test batch predicted in one
    go); False where the framework cannot test such a batch (mmseg's)."""
    if cfg.default_scope == 'mmseg':
        return False
    cfg.model.type = cfg.model.pop('model_type')
    cfg.model.data_preprocessor.type = 'DetDataPreprocessor'
    return True


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='work_dirs/demo', help="the demo's folder with its trained checkpoints")
    parser.add_argument('--tasks', nargs='+', default=list(DEMO_TASKS), choices=list(DEMO_TASKS))
    parser.add_argument('--sizes', nargs='+', choices=[label for label, _, _ in TEST_SIZES],
                        default=[label for label, _, _ in TEST_SIZES], help="the demo's test sizes to evaluate at")
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--name', help='result name (default batch_company_<ISA>)')
    args = parser.parse_args(argv)
    from cpvt_backbones.adapters.evaluation import evaluate, set_test_scale  # mmengine: not needed by ``table``
    from cpvt_backbones.adapters.runner import load_config, quiet_known_warnings
    quiet_known_warnings()
    info = cpu_info()
    name = args.name or f"batch_company_{info['isa'].lower()}"
    print(f"[batch_company] {info['cpu']}: {info['isa']} ({', '.join(info['flags'])}), "
          f'{torch.get_num_threads()} threads, torch {torch.__version__}', flush=True)
    n = args.batch_size   # each way: (batch size, the framework's own model and preprocessor)
    ways = {'batch 1': (1, False), f'batch {n} as alone': (n, False), f"batch {n}, frameworks' own": (n, True)}
    rows = []
    for task in args.tasks:
        spec = DEMO_TASKS[task]
        base = load_config(spec.config)
        checkpoint = final_checkpoint(args.out, task, base)
        if not checkpoint.is_file():
            raise SystemExit(f'no trained checkpoint {checkpoint}: run the demo into {args.out} first')
        for label, factors, keep_ratio in [size for size in TEST_SIZES if size[0] in args.sizes]:
            for way, (batch_size, own) in ways.items():
                cfg = copy.deepcopy(base)
                set_test_scale(cfg, scaled(cfg, factors), keep_ratio)
                cfg.test_dataloader.batch_size = batch_size
                if own and not frameworks_own(cfg):
                    continue
                start = time.perf_counter()
                metrics = evaluate(cfg, str(checkpoint), str(Path(args.out) / task / 'batch_company'),
                                   f'{task}-{label}-{way}')
                seconds = time.perf_counter() - start
                for score in SCORES.values():
                    if score.task == task:
                        value = float(metrics.get(score.metric, 0.)) * score.scale
                        rows.append(dict(task=task, score=score.label, size=label, way=way, value=value,
                                         seconds=seconds))
                        print(f'[batch_company] {score.label:<20} {label:<40} {way:<28} {value:.4f} '
                              f'({seconds:.1f} s)', flush=True)
    record = dict(rows=rows, ways=list(ways), batch_size=args.batch_size, out=args.out,
                  command=shlex.join(['python', '-m', 'benchmarks.batch_company'] + sys.argv[1:]),
                  torch=torch.__version__, threads=torch.get_num_threads(), **info)
    write_report(RESULTS, name, record, table(record) + '\n')
    print(table(record))
    return record


def table(record: dict) -> str:
    """Markdown: a row per score and test size, a column per way, then the largest change from batch 1."""
    ways = record['ways']
    cells = {}
    for row in record['rows']:
        cells.setdefault((row['score'], row['size']), {})[row['way']] = row['value']
    lines = ['| score | test size | ' + ' | '.join(ways) + ' | ' +
             ' | '.join(f'{w} - batch 1' for w in ways[1:]) + ' |', '|---|---|' + '---|' * (2 * len(ways) - 1)]
    for (score, size), values in cells.items():
        lines.append(f'| {score} | {size} | ' + ' | '.join(f'{values[w]:.3f}' if w in values else 'refused'
                                                           for w in ways) + ' | ' +
                     ' | '.join(f'{values[w] - values[ways[0]]:+.3f}' if w in values else '' for w in ways[1:]) + ' |')
    runs = {(r['task'], r['size'], r['way']): r['seconds'] for r in record['rows']}   # one per evaluation
    shared = [key for key in {(t, z) for t, z, _ in runs} if all((*key, w) in runs for w in ways)]
    tasks = sorted({t for t, _ in shared})
    seconds = {w: sum(runs[(*key, w)] for key in shared) for w in ways}
    threads = f"{record['threads']} thread" + ('s' if record['threads'] > 1 else '')
    return '\n'.join(lines) + (
        f"\n\n`{record['command']}` on {record['cpu']} ({record['isa']}), torch {record['torch']}, {threads}; "
        f"evaluation wall time over the sizes of the tasks every way ran ({', '.join(tasks)}): " +
        ', '.join(f'{w} {s:.0f} s' for w, s in seconds.items()) + '.')


if __name__ == '__main__':
    main()
