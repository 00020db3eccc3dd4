"""Generate the embedded "shapes" data: COCO boxes and label maps (mmdet, mmseg) under data/shapes, or with
--classification one-shape crops in class folders (mmpretrain) under data/shapes_cls."""
import argparse
import time

from cpvt_backbones.datasets import ShapesSpec, generate_shape_crops, generate_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--classification', action='store_true', help='write the classification crops instead')
    parser.add_argument('--root', help='default: data/shapes, or data/shapes_cls with --classification')
    parser.add_argument('--num-train', type=int, help='default: 800 scenes or 4000 crops')
    parser.add_argument('--num-val', type=int, help='default: 150 scenes or 400 crops')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    given = {k: v for k, v in dict(num_train=args.num_train, num_val=args.num_val).items() if v is not None}
    start = time.perf_counter()
    if args.classification:
        root = args.root or 'data/shapes_cls'
        counts = generate_shape_crops(root, seed=args.seed, **given)
    else:
        root = args.root or 'data/shapes'
        counts = generate_shapes(root, ShapesSpec(seed=args.seed, **given))
    print(f'shapes data at {root}: {counts} images ({time.perf_counter() - start:.1f} s)')


if __name__ == '__main__':
    main()
