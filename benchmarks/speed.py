"""Speed and memory of our pyramid CPVT backbone on every registered engine (``deploy.ENGINES``, each named by its
engine: ``fused``, the reference, ``torch``, the model as it is, then ``openvino``, ``onnxruntime`` and any engine
registered since), against mmseg's ``PCPVT``/``SVT`` and timm's ``twins_pcpvt_*``/``twins_svt_*`` (what a CPU
deployer would pick instead); with ``--precision bf16 int8`` also every engine at those precisions it runs
(``<engine>_<precision>``; bf16 on CPUs with AVX512-BF16 or AMX) and onnxruntime's dynamic int8 quantization of our
export (``onnxruntime_dynamic_int8``); with ``--engines`` also OpenVINO compiled per shape, OpenVINO by hand and
torch.compile (inductor, freezing), each with its first call at every case (where it compiles) reported.

    python -m benchmarks.speed [NAME ...] [--json PATH] [--repeats 5] [--cases infer224 infer512 ...]
                               [--precision bf16 int8] [--engines] [--retain-freed-memory]
    python -m benchmarks.speed --scaling [--sizes 128 256 ...] [--json PATH] [--plot PATH]
    python -m benchmarks.speed --breakdown [--cases ...] [--json PATH]
    python -m benchmarks.speed --end-to-end [retinanet semantic_fpn semantic_fpn_shapes] [--precision bf16 int8]
                               [--cases ...]
    make bench

The implementations are in ``peers.py``, the measuring in ``timing.py``, the tables and plot in ``speed_tables.py``.

Every implementation gets identical weights (the native ones: timm takes them unchanged, mmseg through
``convert.native_to_mmseg``, its encoder-layer LayerNorms set to the official eps 1e-6, which it hard-codes to
1e-5), and their feature maps are compared with the reference's before anything is timed. Each case then runs the
implementations interleaved (A B C A B C ...) in one process after a warm-up round and reports medians. Inference
runs under ``torch.inference_mode()``; the training step is forward + backward of the sum of the maps' means (no
optimizer), in train mode with drop path 0. Peak memory is the rise of the process's resident-set high-water mark
over one call (reset through /proc/self/clear_refs, Linux only). GFLOPs are the reference's, counted by torch's
FlopCounterMode with the CPU flash-attention kernels registered: 2 FLOPs per multiply-add of every matmul,
convolution and attention product (backward included for the training step); norms, activations, softmax and adds
are not counted. The matmul rate is the practical limit: fp32 2048 x 2048 x 2048 products through MKL (``torch.mm``) and
through oneDNN (the two libraries the fused path chooses from), timed in the same interleaved rounds as the
models (the speed of a shared machine drifts from minute to minute); the faster median counts. (On AMD CPUs
MKL runs its AVX2 code even where oneDNN uses AVX-512.) Every result records the CPU's vector ISA and the
allocator settings, and each timed call's minor page faults: glibc returns large freed blocks to the OS, so a
model whose activations exceed its mmap threshold (at most 32 MiB) pays for fresh zeroed pages on every call.
``--retain-freed-memory`` makes glibc keep them (as onnxruntime's arena or jemalloc do) for every
implementation in the process, which shows how much of a difference is allocation rather than compute.
Names without an mmseg/timm counterpart (``cpvt_*``, ``pcpvt_tiny``) are timed alone.

``--end-to-end`` times whole models in tensor mode (backbone + neck + head of the COCO RetinaNet and the ADE20K
Semantic FPN configs with ``pcpvt_small`` by default, or the demo's Semantic FPN with ``pcpvt_tiny``,
``semantic_fpn_shapes``; random weights; ``peers.build_dense``) on every registered engine
(``torch``: the model as it is, float32, the reference; ``fused``: its backbone on the fused engine), each at
every ``--precision`` it runs; by default at 800 x 1216 and 512 x 512, batch 1. Besides the medians it reports each
engine's build time (export, conversion, quantization, compilation) and its first call.

``--breakdown`` profiles one call of the fused engine per case (torch.profiler, self time of each op) and splits time
and FLOPs into GEMMs, attention, convolutions and the rest (norms, activations, adds, copies, Python), with each
kind's rate as a fraction of the matmul rate, and the ``ceiling``: the fraction the whole model would reach if
the rest took no time at all.
"""
import argparse
import json
import statistics
from pathlib import Path

import torch

from benchmarks.peers import (
    DEFAULT_DENSE,
    DENSE_CONFIGS,
    DENSE_PEERS,
    DENSE_REFERENCE,
    PEERS,
    REFERENCE,
    build,
    build_dense,
    fused_backbone,
)
from benchmarks.speed_tables import breakdown_table, dense_table, plot_scaling, scaling_table, table
from benchmarks.timing import CASES, SCALING_SIZES, allocator_info, breakdown, retain_freed_memory, run_case, scaling
from cpvt_backbones.deploy import ENGINES
from cpvt_backbones.utils import cpu_info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('names', nargs='*', default=['pcpvt_small'])
    parser.add_argument('--cases', nargs='+', choices=sorted(CASES),
                        help='default: every case; with --end-to-end infer800x1216 infer512_b1')
    parser.add_argument('--repeats', type=int, default=5, help='timed rounds per case, after one warm-up round')
    parser.add_argument('--threads', type=int, help='torch threads (default: torch.get_num_threads())')
    parser.add_argument('--scaling', action='store_true', help='time/memory against input pixels instead')
    parser.add_argument('--breakdown', action='store_true', help="where the fused engine's time goes, by kind of op")
    parser.add_argument('--sizes', type=int, nargs='+', default=list(SCALING_SIZES), help='for --scaling')
    parser.add_argument('--json', help='write the results here')
    parser.add_argument('--onnx-dir', default='work_dirs/bench_onnx', help='where our ONNX export is written')
    parser.add_argument('--skip-engines', nargs='+', default=[], choices=list(ENGINES), metavar='ENGINE',
                        help=f'leave these registered engines out ({", ".join(ENGINES)})')
    parser.add_argument('--precision', nargs='*', default=[], choices=('bf16', 'int8'),
                        help="also these precisions, on every registered engine that runs them; int8 also "
                             "onnxruntime's dynamic int8")
    parser.add_argument('--engines', action='store_true',
                        help='also OpenVINO compiled per shape, OpenVINO by hand and torch.compile')
    parser.add_argument('--end-to-end', nargs='*', choices=sorted(DENSE_CONFIGS), metavar='MODEL',
                        help='time whole models in tensor mode instead (default: '
                             f'{" ".join(DEFAULT_DENSE)})')
    parser.add_argument('--plot', default='benchmarks/results/scaling.png', help='for --scaling')
    parser.add_argument('--retain-freed-memory', action='store_true',
                        help='make glibc keep freed memory for reuse (see retain_freed_memory)')
    args = parser.parse_args()
    if args.cases is None:
        args.cases = ['infer800x1216', 'infer512_b1'] if args.end_to_end is not None else list(CASES)
    if args.retain_freed_memory:
        retain_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = dict(torch=torch.__version__, threads=torch.get_num_threads(), **cpu_info(),
                allocator=allocator_info(args.retain_freed_memory))
    print(f"[bench] {meta['cpu']}: {meta['isa']} ({', '.join(meta['flags']) or 'no AVX flags'}), "
          f"{meta['threads']} threads, torch {meta['torch']}, allocator: {meta['allocator']}", flush=True)
    result = dict(meta)
    if args.scaling:
        name = args.names[0]
        rows = scaling(fused_backbone(name), args.sizes, args.repeats)
        print(scaling_table(rows))
        plot_scaling(rows, Path(args.plot), name)
        print(f'[bench] plot: {args.plot}')
        result.update(name=name, scaling=rows)
    elif args.end_to_end is not None:
        result['cases'] = []
        for task in args.end_to_end or DEFAULT_DENSE:
            impls, setup = build_dense(task, args.precision, skip=args.skip_engines)
            print(f'[bench] {task}: built in ' + ', '.join(f'{k} {v:.1f} s' for k, v in setup.items()), flush=True)
            for case in args.cases:
                row = dict(run_case(impls, case, args.repeats, DENSE_PEERS, reference=DENSE_REFERENCE), model=task,
                           setup_s=setup)
                result['cases'].append(row)
                print(f'[bench] {task} {case}: {DENSE_REFERENCE} {row[f"{DENSE_REFERENCE}_s"]:.3f} s', flush=True)
        print(f'\nend to end, tensor mode (medians of {args.repeats} interleaved rounds)\n'
              f'{dense_table(result["cases"])}\n')
        result['matmul_gflops'] = statistics.median(r['matmul_gflops'] for r in result['cases'])
    elif args.breakdown:
        name = args.names[0]
        model = fused_backbone(name)
        rows = [breakdown(model, case) for case in args.cases]
        print(f'\n{name}, one profiled call per case\n{breakdown_table(rows)}\n')
        result.update(name=name, breakdown=rows)
    else:
        result['cases'] = []
        for name in args.names:
            impls = build(name, onnx_dir=args.onnx_dir, precisions=args.precision, engines=args.engines,
                          skip=args.skip_engines)
            rows = []
            for case in args.cases:
                rows.append(dict(run_case(impls, case, args.repeats, PEERS, reference=REFERENCE), model=name))
                print(f'[bench] {name} {case}: {REFERENCE} {rows[-1][f"{REFERENCE}_s"]:.3f} s', flush=True)
            print(f'\n{name} (times are medians of {args.repeats} interleaved rounds)\n{table(rows)}\n')
            result['cases'] += rows
        result['matmul_gflops'] = statistics.median(r['matmul_gflops'] for r in result['cases'])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f'[bench] wrote {args.json}')


if __name__ == '__main__':
    main()
