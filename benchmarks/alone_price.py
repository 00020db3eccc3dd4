"""What predicting each image of a padded batch as alone costs: detectors and segmentors built from the configs
(type 'PredictAlone'; random weights) on one stream of images of mixed sizes, three ways, interleaved in one
process: batch 1 (each image alone), batch N as alone (``model.test_step``: backbone, neck and heads once on the
padded batch, exact on each image's region, the decoding image by image: ``adapters.exact``), batch N image by
image (``predict_alone(model, batched=False)``: the backbone once on the padded batch, the neck and heads image by
image) and batch N padded (the same padded batch through the framework's own ``predict`` in one go,
``model.predict_batch``: the answer then depends on the batch's company).

    python -m benchmarks.alone_price [--configs ...] [--images 16] [--batch-size 8] [--rounds 3] [--name NAME]

Writes benchmarks/results/NAME.{json,md} (default ``alone_price_<ISA>``): per config and way the images per
second (median of the rounds, each round every way once, in turn), the price of exactness at batch N (as alone
over padded, minus 1), the ISA, threads and the command.
"""
import argparse
import copy
import importlib
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.study.grid import write_report
from cpvt_backbones.utils import cpu_info

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / 'results'
# config: the range of image sides drawn for it (the shapes models at their test scale, the paper's models at a
# reduced COCO / ADE20K scale that two cores can time)
CONFIGS = {
    'shapes/retinanet_pcpvt-tiny_fpn_shapes.py': (120, 260),
    'shapes/mask-rcnn_pcpvt-tiny_fpn_shapes.py': (120, 260),
    'shapes/fpn_pcpvt-tiny_shapes.py': (120, 260),
    'shapes/upernet_pcpvt-tiny_shapes.py': (120, 260),
    'retinanet/retinanet_pcpvt-s_fpn_1x_coco.py': (256, 480),
    'sem_fpn/fpn_pcpvt-s_8xb2-80k_ade20k-512x512.py': (256, 480),
}


def build(config: str) -> torch.nn.Module:
    """``configs/<config>``'s model with random weights (seed 0), in evaluation mode."""
    from mmengine.registry import DefaultScope

    from cpvt_backbones.adapters.runner import read_config
    cfg = read_config(str(ROOT / 'configs' / config))
    cfg.model.backbone.init_cfg = None
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = importlib.import_module(f'{cfg.default_scope}.registry').MODELS.build(cfg.model).eval()
    model.scope = cfg.default_scope
    return model


def stream(scope: str, n: int, sides: tuple[int, int], seed: int = 0) -> dict:
    """``n`` raw uint8 images of random sizes (sides uniform in ``sides``) with data samples, as a dataloader
    hands them over."""
    structures = importlib.import_module(f'{scope}.structures')
    sample = structures.DetDataSample if scope == 'mmdet' else structures.SegDataSample
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(sides[0], sides[1] + 1, (n, 2), generator=g).tolist()
    return dict(inputs=[torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes],
                data_samples=[sample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1., 1.)))
                              for h, w in sizes])


def _chunks(data: dict, size: int) -> list[dict]:
    n = len(data['inputs'])
    return [{k: copy.deepcopy(v[i:i + size]) for k, v in data.items()} for i in range(0, n, size)]


def _alone(model, chunk):
    model.test_step(chunk)


def _image_by_image(model, chunk):
    from cpvt_backbones.adapters.alone import predict_alone
    predict_alone(model, batched=False)
    try:
        model.test_step(chunk)
    finally:
        predict_alone(model, batched=True)


def _padded(model, chunk):
    data = model.data_preprocessor(chunk, False)
    model.predict_batch(data['inputs'], data['data_samples'])


def time_way(model, data: dict, batch_size: int, way) -> float:
    """Seconds to predict every image of ``data`` in batches of ``batch_size`` the ``way`` given."""
    chunks = _chunks(data, batch_size)   # fresh copies: prediction writes into the data samples
    start = time.perf_counter()
    with torch.no_grad():
        for chunk in chunks:
            way(model, chunk)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--configs', nargs='+', default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument('--images', type=int, default=16, help='images in the stream')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--name', help='result name (default alone_price_<ISA>)')
    args = parser.parse_args(argv)
    from cpvt_backbones.adapters.runner import quiet_known_warnings
    quiet_known_warnings()
    info = cpu_info()
    name = args.name or f"alone_price_{info['isa'].lower()}"
    print(f"[alone_price] {info['cpu']}: {info['isa']} ({', '.join(info['flags'])}), "
          f'{torch.get_num_threads()} threads, torch {torch.__version__}', flush=True)
    n = args.batch_size
    ways = {'batch 1': (1, _alone), f'batch {n} as alone': (n, _alone),
            f'batch {n} image by image': (n, _image_by_image), f'batch {n} padded': (n, _padded)}
    rows = []
    for config in args.configs:
        model = build(config)
        data = stream(model.scope, args.images, CONFIGS[config])
        time_way(model, data, n, _alone)   # warm-up
        seconds = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, (batch_size, fn) in ways.items():
                seconds[way].append(time_way(model, data, batch_size, fn))
        row = dict(config=config, sides=CONFIGS[config],
                   rate={way: args.images / statistics.median(s) for way, s in seconds.items()}, seconds=seconds)
        row['price'] = row['rate'][f'batch {n} padded'] / row['rate'][f'batch {n} as alone'] - 1
        rows.append(row)
        print(f'[alone_price] {config}: ' + ', '.join(f'{w} {r:.2f} images/s' for w, r in row['rate'].items()) +
              f", as alone costs {100 * row['price']:+.1f}% at batch {n}", flush=True)
    record = dict(rows=rows, ways=list(ways), images=args.images, batch_size=n, rounds=args.rounds,
                  command=shlex.join(['python', '-m', 'benchmarks.alone_price'] + sys.argv[1:]),
                  torch=torch.__version__, threads=torch.get_num_threads(), **info)
    write_report(RESULTS, name, record, table(record) + '\n')
    print(table(record))
    return record


def table(record: dict) -> str:
    """Markdown: a row per config, images per second each way, then the price of exactness at batch N."""
    ways, n = record['ways'], record['batch_size']
    lines = ['| config | image sides | ' + ' | '.join(f'{w} (images/s)' for w in ways) +
             f' | as alone over padded at batch {n} |', '|---|---|' + '---|' * (len(ways) + 1)]
    for row in record['rows']:
        lines.append(f"| {row['config']} | {row['sides'][0]}-{row['sides'][1]} | " +
                     ' | '.join(f"{row['rate'][w]:.2f}" for w in ways) + f" | {100 * row['price']:+.1f}% |")
    threads = f"{record['threads']} thread" + ('s' if record['threads'] > 1 else '')
    return '\n'.join(lines) + (
        f"\n\n`{record['command']}` on {record['cpu']} ({record['isa']}), torch {record['torch']}, {threads}; "
        f"{record['images']} images of random sizes, median of {record['rounds']} interleaved rounds; random "
        'weights (RetinaNet and Mask R-CNN at their configs\' score thresholds).')


if __name__ == '__main__':
    main()
