"""The study's command line: this shard's runs trained and checked, then, once every run of the grid is done, the
report (``main``)."""
import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks import confirm_detail
from benchmarks.confirm_detail.design import load_data, object_scales, run, study_config
from benchmarks.confirm_detail.protocol import PROTOCOL, ROOT, TAG, Protocol, check_may_run, check_study_protocol
from benchmarks.confirm_detail.render import scales_text, write_outputs
from benchmarks.study.common import add_run_options, parse_shard
from benchmarks.study.config import StudyConfig
from benchmarks.study.grid import Grid, conduct
from benchmarks.study.pool import drawing_pool, run_all
from benchmarks.study.records import provenance


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='python -m benchmarks.confirm_detail', description=confirm_detail.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--protocol', type=Path, default=PROTOCOL, help='the protocol file the study runs from')
    p.add_argument('--pilot', action='store_true',
                   help='run the protocol\'s pilot (its arms, candidate recipes and seeds 100..199; a draft will do)')
    p.add_argument('--scales', action='store_true',
                   help='print the object sizes of training crops and tests (no training) and exit')
    p.add_argument('--shard', default='0/1', help='K/N: run every N-th run from the K-th (0-based)')
    add_run_options(p, ROOT)
    args = p.parse_args(argv)
    args.shard_index, args.num_shards = parse_shard(p, args.shard)
    if args.jobs < 1 or args.threads < 1:
        p.error(f'--jobs and --threads must be >= 1, got {args.jobs} and {args.threads}')
    return args


def _run_shared(data: dict, arm: str, seed: int, config: StudyConfig, protocol: Protocol, origin: dict,
                candidate: str | None) -> str:
    run(arm, seed, config, data[protocol.object_size(candidate)], protocol, origin, candidate)
    return f'{arm}-seed{seed}'


def main(argv: Sequence[str] | None = None) -> dict:
    """Train and test this shard's runs, then (once every run is done) write the study's outputs."""
    args = parse_args(argv)
    protocol = Protocol.load(args.protocol)
    pilot = args.pilot
    candidates = list(protocol['pilot']['recipes']) if pilot else [None]
    if args.scales:
        scales = {c or '': object_scales(protocol, pilot=pilot, candidate=c) for c in candidates}
        for c, s in scales.items():
            print((f'{c}: ' if pilot else '') + scales_text(s))
        return scales
    fields = dict(device=args.device, tf32=args.tf32, work_dir=args.work_dir, out=args.out)
    configs = {c: study_config(protocol, pilot, c, **fields) for c in candidates}
    first = next(iter(configs.values()))
    check_may_run(protocol, first.seeds)
    check_study_protocol(args.work_dir / first.name, protocol)
    keys = [(c, arm, seed) for c in candidates for seed in first.seeds for arm in first.variants]
    grid = Grid(keys, lambda k: [configs[k[0]].run_dir(k[1], k[2])], args.shard_index, args.num_shards)

    def work(todo: list) -> None:
        origin = provenance(args.device)   # refuses uncommitted code before anything is drawn
        by_size = {protocol.object_size(c): c for c, _, _ in todo}   # one drawing per object size the runs need
        with drawing_pool(args.jobs) as pool:
            data = {size: load_data(protocol, pilot, pool, c) for size, c in by_size.items()}
        calls = [(arm, seed, configs[c], protocol, origin, c) for c, arm, seed in todo]
        run_all(_run_shared, calls, data, args.jobs, args.threads, TAG)

    def report(runs: list[dict], meta: dict) -> dict:
        results: dict = {}
        for r in runs:
            results.setdefault(r['candidate'] or '', []).append(r)
        meta = dict(meta, object_scales={c: object_scales(protocol, pilot=pilot, candidate=c or None)
                                         for c in results})
        document = write_outputs(results, protocol, pilot, args.out, meta)
        print(f'[{TAG}] {document["meta"]["wall_minutes"]} min; results in {args.out}')
        return document
    return conduct(grid, TAG, 'benchmarks.confirm_detail', argv, work,
                   lambda k: [run(k[1], k[2], configs[k[0]], None, protocol)], report) or {}
