"""What masking the window padding costs Twins-SVT: the same weights with ``window_mask=True`` (the dense configs)
and ``False`` (timm's behaviour), both on the fused engine, timed interleaved in one process
(``timing.run_case``).

    python -m benchmarks.window_mask [NAME] [--cases infer224 infer512 ...] [--repeats 7] [--json PATH]

At 224 x 224 no stage's map is padded (every map a multiple of 7 tokens), so the two run the same work; at the
other sizes every stage pads its map to whole 7 x 7 windows and the masked model adds a key mask to each windowed
attention. Prints the CPU's vector ISA with the table; the per-round ratios (``round_s``) give the spread.
"""
import argparse
import json
from pathlib import Path

import torch

from benchmarks.timing import CASES, run_case
from cpvt_backbones import create_model, prepare
from cpvt_backbones.utils import cpu_info

DEFAULT_CASES = ('infer224', 'infer512', 'infer480x640', 'infer800x1216')


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('name', nargs='?', default='svt_small')
    parser.add_argument('--cases', nargs='+', default=list(DEFAULT_CASES),
                        choices=sorted(c for c, spec in CASES.items() if spec['mode'] == 'infer'))
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    info = cpu_info()
    print(f"[window_mask] {info['cpu']}: {info['isa']} ({', '.join(info['flags'])}), "
          f'{torch.get_num_threads()} threads, torch {torch.__version__}', flush=True)
    torch.manual_seed(0)
    weights = create_model(args.name, features_only=True).state_dict()
    impls = {}
    for key, mask in (('masked', True), ('unmasked', False)):
        model = create_model(args.name, features_only=True, window_mask=mask).eval()
        model.load_state_dict(weights)
        impls[key] = prepare(model, 'fused')
        impls[key].inference_only = True
    rows = []
    print('| case | masked s | unmasked s | masked / unmasked (median) | per-round range | max diff |')
    print('|---|---|---|---|---|---|')
    for case in args.cases:
        row = run_case(impls, case, args.repeats, ('unmasked',), reference='masked')
        ratios = [a / b for a, b in zip(row['round_s']['masked'], row['round_s']['unmasked'], strict=True)]
        row.update(model=args.name, ratio=row['masked_s'] / row['unmasked_s'], ratio_range=[min(ratios), max(ratios)])
        rows.append(row)
        print(f"| {case} | {row['masked_s']:.3f} | {row['unmasked_s']:.3f} | {row['ratio']:.3f} | "
              f"{min(ratios):.3f}-{max(ratios):.3f} | {row['max_abs_diff_unmasked']:.2e} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(info, threads=torch.get_num_threads(), torch=torch.__version__,
                                                   cases=rows), indent=2))
    return rows


if __name__ == '__main__':
    main()
