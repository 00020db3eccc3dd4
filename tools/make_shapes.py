"""Generate the embedded "shapes" dataset (COCO boxes for mmdet, label maps for mmseg) under data/shapes."""
import argparse
import time

from cpvt_backbones.datasets import ShapesSpec, generate_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--root', default='data/shapes')
    parser.add_argument('--num-train', type=int, default=ShapesSpec.num_train)
    parser.add_argument('--num-val', type=int, default=ShapesSpec.num_val)
    parser.add_argument('--seed', type=int, default=ShapesSpec.seed)
    args = parser.parse_args()
    start = time.perf_counter()
    counts = generate_shapes(args.root, ShapesSpec(num_train=args.num_train, num_val=args.num_val, seed=args.seed))
    print(f'shapes dataset at {args.root}: {counts} images ({time.perf_counter() - start:.1f} s)')


if __name__ == '__main__':
    main()
