"""The study's command line (``python -m benchmarks.native_detail``): its options (``parse_args``), this shard's
runs trained and tested (``train_runs``) or a trained study's runs tested again (``retest_runs``), and the report,
written by whichever invocation finds every run done (``main``)."""
import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks.native_detail.design import (
    MATCHED_LEVEL,
    REPLACED,
    STUDIED,
    TEST_SEED,
    TRAIN_SEED,
    VAL_IMAGES,
    load_tests,
    load_training,
    load_validation,
    object_scales,
    study_config,
)
from benchmarks.native_detail.render import plot, render_markdown
from benchmarks.native_detail.runs import retest, revalidate, run
from benchmarks.native_detail.selection import MATCHES, select, summarise
from benchmarks.study import records
from benchmarks.study.common import add_run_options, format_paired, parse_shard
from benchmarks.study.config import VARIANTS, StudyConfig
from benchmarks.study.grid import Grid, conduct, write_report
from benchmarks.study.pool import drawing_pool, run_all
from benchmarks.study.records import provenance
from benchmarks.study.report import trained_on

ROOT = Path(__file__).resolve().parents[2]
DESCRIPTION = ('Resolution with real detail by construction, from matched starts: which of four shapes a scene '
               'shows, every image drawn natively at the size it is used at; each variant trained at 56 px and '
               'tested on held-out scenes drawn at 56-112 px, at its final check and at the check where its '
               'validation top-1 reaches a matched level. With --from, a trained study\'s runs are tested again '
               '(and with --val-seed selected again) without training. Design and history: '
               'docs/resolution_study.md.')


def parse_args(argv: Sequence[str] | None = None) -> tuple[StudyConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(prog='python -m benchmarks.native_detail', description=DESCRIPTION)
    p.add_argument('--variants', nargs='+', default=list(STUDIED), choices=list(VARIANTS))
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
    p.add_argument('--shard', default='0/1', help='K/N: run every N-th (variant, seed) from the K-th (0-based)')
    p.add_argument('--fields', type=int, default=8000, help='training fields drawn, the validation split included')
    p.add_argument('--val-fields', type=int, default=800, help='the last fields, held out for validation')
    p.add_argument('--test-images', type=int, default=1000)
    p.add_argument('--epochs', type=int, default=12)
    p.add_argument('--checks-per-epoch', type=int, default=4,
                   help='validation checks an epoch, the weights of each kept for the selected checks\' tests')
    p.add_argument('--smooth', type=int, default=3,
                   help='consecutive checks whose mean validation top-1 selection reads (odd)')
    p.add_argument('--level', type=float, default=None,
                   help=f'the matched level L (validation top-1, %%), fixed before any test (docs/resolution_study.md; '
                        f'default {MATCHED_LEVEL}); refused with --val-seed, where L is the rule\'s')
    p.add_argument('--match', choices=list(MATCHES), default='first',
                   help='the matched checks\' rule (MATCHES): first, the first check to reach L, L the lowest '
                        'variant mean of the runs\' best; nearest, at the first crossing of L the nearer check, L the '
                        'lowest run\'s best')
    add_run_options(p, ROOT)
    p.add_argument('--name', default='native_checked')
    p.add_argument('--from', dest='source', default=None, metavar='STUDY',
                   help='train nothing: test the runs of STUDY (trained here, their checks\' weights under its '
                        'run folders) again, on the scene set --test-seed, each analysis averaging --window checks')
    p.add_argument('--window', type=int, default=1,
                   help='checks (odd) centred on each selected check whose tests are averaged (--from only)')
    p.add_argument('--test-seed', type=int, default=TEST_SEED, help='the held-out scene set tested (--from only)')
    p.add_argument('--val-seed', type=int, default=None,
                   help='select on a validation set of this scene set drawn as the tests are (--from only)')
    p.add_argument('--val-images', type=int, default=VAL_IMAGES, help='the --val-seed set\'s scenes')
    args = p.parse_args(argv)
    shard_index, num_shards = parse_shard(p, args.shard)
    if args.fields - args.val_fields < 128 or args.val_fields < 1 or args.test_images < 1:
        p.error('need --fields - --val-fields >= 128 (one batch), --val-fields >= 1 and --test-images >= 1')
    if args.checks_per_epoch < 1 or args.smooth < 1 or args.smooth % 2 != 1:
        p.error(f'need --checks-per-epoch >= 1 and an odd --smooth >= 1, got {args.checks_per_epoch} and '
                f'{args.smooth}')
    if args.window < 1 or args.window % 2 != 1:
        p.error(f'need an odd --window >= 1, got {args.window}')
    if args.source is None and (args.window != 1 or args.test_seed != TEST_SEED):
        p.error('--window and --test-seed test a trained study again: give it with --from')
    if args.source is not None and args.test_seed in (TRAIN_SEED, TEST_SEED):
        p.error(f'--test-seed {args.test_seed} is not a fresh scene set (training fields: {TRAIN_SEED}, the '
                f'trained study\'s tests: {TEST_SEED})')
    if args.val_seed is not None:
        if args.source is None or args.level is not None or args.val_images < 1:
            p.error('--val-seed selects the checks of a trained study again (give --from), with the rule\'s level '
                    '(no --level), on --val-images >= 1 scenes')
        if args.val_seed in (TRAIN_SEED, TEST_SEED, args.test_seed):
            p.error(f'--val-seed {args.val_seed} is not a scene set of its own (training fields: {TRAIN_SEED}, '
                    f'tests: {TEST_SEED} and {args.test_seed})')
    elif args.level is None:
        args.level = MATCHED_LEVEL
    if args.jobs < 1 or args.threads < 1:
        p.error(f'--jobs and --threads must be >= 1, got {args.jobs} and {args.threads}')
    config = study_config(args.variants, args.seeds, args.fields - args.val_fields, args.test_images, args.epochs,
                          args.device, tf32=args.tf32, shard_index=shard_index, num_shards=num_shards,
                          work_dir=args.work_dir, out=args.out, name=args.name)
    return config, args


def _run_shared(data, variant: str, seed: int, config: StudyConfig, origin: dict, args: argparse.Namespace) -> str:
    run(variant, seed, config, data, origin, args.checks_per_epoch, args.smooth, args.level, args.match)
    return f'{variant}-seed{seed}'


def train_runs(runs: list[tuple[str, int]], config: StudyConfig, args: argparse.Namespace) -> None:
    """Train and test ``runs`` (in ``args.jobs`` processes sharing one memory-mapped copy of the drawn images where
    > 1)."""
    origin = provenance(config.device)   # refuses uncommitted code before anything is drawn
    with drawing_pool(args.jobs) as pool:
        data = (*load_training(config, args.val_fields, pool), load_tests(config, pool))
    run_all(_run_shared, [(variant, seed, config, origin, args) for variant, seed in runs], data, args.jobs,
            args.threads, 'native')


def retest_runs(runs: list[tuple[str, int]], config: StudyConfig, args: argparse.Namespace,
                keys: Sequence[tuple[str, int]]) -> None:
    """Test ``runs`` of the study ``args.source`` again (``retest``), one after another; a run the source has not
    trained yet is left for a later invocation. With ``args.val_seed`` the runs are validated first
    (``revalidate``) and tested once every run of ``keys`` (the whole grid) is validated, at the rule's level
    over those curves."""
    origin = provenance(config.device)
    source = config.replace(name=args.source)
    ready = [(v, s) for v, s in runs if (source.run_dir(v, s) / 'result.json').is_file()]
    for variant, seed in sorted(set(runs) - set(ready)):
        print(f'[native] {variant} seed {seed} of {args.source} is not trained yet: left for a later invocation',
              flush=True)
    level, validations = args.level, {}
    if args.val_seed is not None and ready:
        data = load_validation(args.val_images, args.val_seed)
        validations = {key: revalidate(*key, config, source, data, origin, args.val_seed) for key in ready}
        curves = {key: records.read(config.run_dir(*key) / 'validation.json') for key in keys}
        waiting = [config.run_dir(*key).name for key, curve in curves.items() if curve is None]
        if waiting:
            print(f'[native] tests wait until every run is validated (not yet: {", ".join(waiting)})', flush=True)
            return
        level = select(list(curves.values()), config.variants, args.smooth, match=args.match)['level_rule']
        print(f'[native] the matched level over every run\'s validation on set {args.val_seed}: {level:.2f}',
              flush=True)
    data = load_tests(config, seed=args.test_seed) if ready else None
    for variant, seed in ready:
        retest(variant, seed, config, source, data, origin, args.smooth, level, args.window, args.test_seed,
               validations.get((variant, seed)), args.match)


def run_seconds(result: dict) -> float:
    """What a run cost here: its training (none for a run tested again: its source's), validation and tests."""
    return (0. if 'trained' in result else result['train_seconds']) + result.get('val_seconds', 0.) \
        + result['eval_seconds']


def report(results: list[dict], config: StudyConfig, args: argparse.Namespace, invocation: dict) -> dict:
    """The study's summary of ``results`` (every run, in grid order) and its report (NAME.{json,csv,md,png} under
    ``config.out``), its meta ``invocation``'s (``run_meta``) with the study's settings and provenance."""
    summary = summarise(results, config, args.smooth, args.level, args.window, args.match)
    meta = dict(invocation, train_images=config.train_images,
                val_fields=args.val_fields, test_images=config.test_images, seeds=list(config.seeds),
                epochs=config.epochs, checks_per_epoch=args.checks_per_epoch, smooth=args.smooth, level=args.level,
                match=args.match,
                window=args.window, test_seed=args.test_seed, source=args.source, val_seed=args.val_seed,
                val_images=args.val_images if args.val_seed is not None else None,
                iterations=results[0]['iterations'], device=config.device, tf32=config.tf32,
                trained_on=trained_on([dict(r, device=r['accelerator']) for r in results]),
                torch=sorted({r['torch'] for r in results}), commits=sorted({r['commit'] for r in results}),
                trained=sorted({(r['trained']['study'], r['trained']['commit'][:10], r['trained']['torch'])
                                for r in results if 'trained' in r}),
                params={r['variant']: r['params'] for r in results},
                object_scales=object_scales(config, args.val_fields, test_seed=args.test_seed),
                replaced=list(REPLACED.get(config.name, ())),
                run_minutes=round(sum(run_seconds(r) for r in results) / 60, 1))
    headline = summary['analyses'][summary['headline']]
    write_report(config.out, config.name, dict(meta=meta, **summary, runs=results),
                 render_markdown(summary, config, meta),
                 [dict(r, change=format_paired(r['change']) if 'change' in r else '',
                       error_share=format_paired(r['error_share']) if 'error_share' in r else '')
                  for r in headline['rows']], {'': lambda path: plot(summary, config, path)})
    print(f'[native] {meta["wall_minutes"]} min; results in {config.out}')
    return summary


def main(argv: Sequence[str] | None = None) -> dict:
    """Train and test this shard's runs (or, with ``--from``, test a trained study's again), then, once every run
    is done, write the study's outputs and return its summary; {} while runs of other shards are pending."""
    config, args = parse_args(argv)
    grid = Grid([(v, seed) for seed in config.seeds for v in config.variants], lambda k: [config.run_dir(*k)],
                config.shard_index, config.num_shards)

    def work(todo: list) -> None:
        if args.source is None:
            train_runs(todo, config, args)
        else:
            retest_runs(todo, config, args, grid.keys)
    summary = conduct(grid, 'native', 'benchmarks.native_detail', argv, work,
                      lambda key: [records.read(config.run_dir(*key) / 'result.json')],
                      lambda results, invocation: report(results, config, args, invocation))
    return {} if summary is None else summary
