"""Run a trained detector or segmentor on image files or folders, at any resolution.

    python tools/infer.py CONFIG CHECKPOINT INPUT [INPUT ...] [--out-dir DIR] [--scale W H | --native]

Writes predictions (JSON for boxes, PNG label maps for masks) under OUT_DIR/preds for every image, and
visualisations (boxes or masks drawn on the image) under OUT_DIR/vis, through mmdet's DetInferencer / mmseg's
MMSegInferencer. The backbones take any size down to 1 x 1; where a framework's visualiser cannot draw an image
(mmseg's fails on a 1 x 1 one), that image gets one line saying so and the run goes on. Our backbones run
optimized (``cpvt_backbones.optimize``; ``--precision int8`` on int8 weights calibrated on ``--calibrate``
images as in tools/test.py; ``--precision bf16`` runs backbone, neck and head under bf16 autocast); ``--plain``
keeps the plain model. ``--engine openvino`` runs backbone,
neck and head on OpenVINO (fp32, bf16, or int8 calibrated with NNCF on ``--calibrate`` images, by default the
config's test set), the same predictions and drawings otherwise.
"""
import argparse
from pathlib import Path

from mmengine.config import DictAction

from cpvt_backbones.adapters.engines import (IMAGE_SUFFIXES, add_precision_args, apply_precision, engine_model,
                                             kept_in_fp32)
from cpvt_backbones.adapters.evaluation import set_test_scale
from cpvt_backbones.adapters.runner import load_config, quiet_known_warnings


def collect_images(inputs):
    files = []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(p for p in item.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        elif item.is_file():
            files.append(item)
        else:
            raise SystemExit(f'no such file or folder: {item}')
    if not files:
        raise SystemExit(f'no images found in {inputs}')
    return [str(f) for f in files]


class DrawOrSay:
    """Mixed in before an inferencer: images are drawn one at a time, and one its visualiser cannot draw is
    reported in one line instead of ending the run (inferencers draw every image before they save any
    prediction, so one failure would lose them all)."""

    def visualize(self, inputs, preds, **kwargs):
        drawn = []
        for one, pred in zip(inputs, preds):
            try:
                drawn.append(super().visualize([one], [pred], **kwargs))
            except Exception as e:  # any failure of drawing; the prediction is kept
                name = Path(one).name if isinstance(one, str) else 'an array'
                print(f'[infer] {name}: not drawn ({type(e).__name__}: {e}); prediction written')
        images = [img for out in drawn if out is not None for img in out]
        return images if kwargs.get('return_vis') else None


def on_engine(model, cfg, args) -> None:
    """The inferencer's model (weights loaded) on the engine asked for: with --engine openvino backbone, neck and
    head on OpenVINO; with the torch engine in bf16 under autocast (its float32 and int8 are the optimized
    backbone the config builds)."""
    calibration = (args.calibrate or 'val') if args.precision == 'int8' else None
    keep = kept_in_fp32(cfg, args.keep_fp32) if args.precision == 'int8' else ()
    engine_model(model, cfg, args.checkpoint, args.engine, args.precision, calibration, args.calibrate_images, keep)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('inputs', nargs='+', help='image files or folders')
    parser.add_argument('--out-dir', default='work_dirs/infer')
    size = parser.add_mutually_exclusive_group()
    size.add_argument('--scale', nargs=2, type=int, metavar=('W', 'H'), help='resize (keeping the aspect ratio)')
    size.add_argument('--native', action='store_true', help='run at each image\'s own size')
    parser.add_argument('--score-thr', type=float, default=0.3, help='boxes drawn above this score')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    add_precision_args(parser)
    args = parser.parse_args()
    quiet_known_warnings()

    cfg = load_config(args.config, args.cfg_options)
    apply_precision(cfg, args, args.checkpoint)
    if args.scale or args.native:
        set_test_scale(cfg, None if args.native else args.scale)
    images = collect_images(args.inputs)
    if cfg.default_scope == 'mmdet':
        from mmdet.apis import DetInferencer
        inferencer = type('DetInferencer', (DrawOrSay, DetInferencer), {})(
            model=cfg, weights=args.checkpoint, device=args.device, show_progress=False)
        on_engine(inferencer.model, cfg, args)
        inferencer(images, out_dir=args.out_dir, pred_score_thr=args.score_thr, no_save_pred=False)
    elif cfg.default_scope == 'mmseg':
        from mmseg.apis import MMSegInferencer
        inferencer = type('MMSegInferencer', (DrawOrSay, MMSegInferencer), {})(
            model=cfg, weights=args.checkpoint, device=args.device)
        on_engine(inferencer.model, cfg, args)
        inferencer(images, out_dir=args.out_dir, img_out_dir='vis', pred_out_dir='preds')
        preds = Path(args.out_dir) / 'preds'
        for i, image in enumerate(images):  # mmseg numbers its label maps in input order; name them as mmdet does
            (preds / f'{i:08d}_pred.png').replace(preds / f'{Path(image).stem}.png')
    else:
        raise SystemExit(f'infer.py handles mmdet and mmseg configs; {args.config} is for {cfg.default_scope}')
    print(f'{len(images)} image(s) -> {args.out_dir}/vis, {args.out_dir}/preds')


if __name__ == '__main__':
    main()
