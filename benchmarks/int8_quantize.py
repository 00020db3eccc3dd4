"""What quantizing activations in plain tensor arithmetic costs the static int8 path, against torch's deprecated
quantized-tensor quantizer (``torch.quantize_per_tensor``), which ``deploy.kernels.OneDNNInt8.quantize`` does not use.

    python -m benchmarks.int8_quantize [NAME] [--cases infer224_b1 infer800x1216 ...] [--repeats 7] [--json PATH]

The fused engine's int8 model (``NAME``, default ``pcpvt_small``, random weights, ranges calibrated on random
images) is timed as it is ('fused_int8') and with the quantizer swapped for the deprecated one while it runs
('deprecated_quantizer'), interleaved in one process (``timing.run_case``); the codes are checked equal first.
"""
import argparse
import json
import warnings
from pathlib import Path

import torch

from benchmarks.timing import CASES, run_case
from cpvt_backbones import create_model, prepare, record_input_ranges
from cpvt_backbones.deploy import kernels as fused
from cpvt_backbones.utils import cpu_info


def deprecated_quantize(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        codes = torch.quantize_per_tensor(x, scale, zero_point, torch.quint8).int_repr()
    return codes.clamp_(max=fused.activation_qmax())


class _WithDeprecatedQuantizer(torch.nn.Module):
    inference_only = True

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        kernel = fused.KERNELS['onednn_int8']
        kernel.quantize = deprecated_quantize  # shadows the class's quantizer while the model runs
        try:
            return self.model(x)
        finally:
            del kernel.quantize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('name', nargs='?', default='pcpvt_small')
    parser.add_argument('--cases', nargs='+', default=['infer224_b1', 'infer480x640', 'infer800x1216', 'infer224'],
                        choices=sorted(CASES))
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--json')
    args = parser.parse_args()
    info = cpu_info()
    print(f"[int8_quantize] {info['cpu']}: {info['isa']} ({', '.join(info['flags'])}), "
          f'{torch.get_num_threads()} threads, torch {torch.__version__}', flush=True)
    torch.manual_seed(0)
    model = create_model(args.name, features_only=True).eval()
    with record_input_ranges(model) as ranges:
        model(torch.randn(2, 3, 224, 224))
    fused_int8 = prepare(model, 'fused', 'int8', input_ranges=ranges)
    fused_int8.inference_only = True
    x = torch.randn(20000, 64) * 3
    same = torch.equal(fused.OneDNNInt8.quantize(x, 6 / 255, 128), deprecated_quantize(x, 6 / 255, 128))
    print(f'[int8_quantize] codes equal to the deprecated quantizer: {same}')
    rows = []
    for case in args.cases:
        row = run_case({'fused_int8': fused_int8, 'deprecated_quantizer': _WithDeprecatedQuantizer(fused_int8)},
                       case, args.repeats, ('deprecated_quantizer',), reference='fused_int8')
        rounds = row['round_s']
        ratios = [a / b for a, b in zip(rounds['fused_int8'], rounds['deprecated_quantizer'], strict=False)]
        row['time_ratio_range'] = [min(ratios), max(ratios)]
        rows.append(row)
        print(f"| {case} | {row['fused_int8_s']:.4f} | {row['deprecated_quantizer_s']:.4f} | "
              f"{row['fused_int8_s'] / row['deprecated_quantizer_s']:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
              f"{row['max_abs_diff_deprecated_quantizer']:.1e} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(info, torch=torch.__version__, codes_equal=same, cases=rows),
                                              indent=2))


if __name__ == '__main__':
    main()
