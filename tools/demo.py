"""Forward passes at sizes no ViT with a position-embedding table would take unchanged.

Prints, for each model, the shapes of the four feature maps and the time per forward pass at several
resolutions, odd ones included. (The detection/segmentation demo replaces this once it exists.)
"""
import argparse
import math
import time

import torch

from cpvt_backbones import create_model

SIZES = [(224, 224), (97, 131), (33, 33), (7, 500), (513, 769)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--models', nargs='+', default=['pcpvt_tiny', 'pcpvt_small', 'cpvt_tiny_gap'])
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f'{"model":<14} {"input":>10}  {"feature maps (C x H x W) at strides 4/8/16/32":<62} {"ms":>7}')
    for name in args.models:
        model = create_model(name, features_only=True).eval()
        for h, w in SIZES:
            x = torch.randn(1, 3, h, w)
            with torch.inference_mode():
                start = time.perf_counter()
                outs = model(x)
                ms = (time.perf_counter() - start) * 1e3
            expected = [(math.ceil(h / s), math.ceil(w / s)) for s in (4, 8, 16, 32)]
            assert [tuple(o.shape[2:]) for o in outs] == expected
            shapes = ', '.join('x'.join(map(str, o.shape[1:])) for o in outs)
            print(f'{name:<14} {h:>4}x{w:<5}  {shapes:<62} {ms:7.1f}')
    print('every map has size ceil(H/s) x ceil(W/s); no position embedding was interpolated')


if __name__ == '__main__':
    main()
