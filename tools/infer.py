"""Run a trained detector or segmentor on image files or folders, at any resolution.

    python tools/infer.py CONFIG CHECKPOINT INPUT [INPUT ...] [--out-dir DIR] [--scale W H | --native]
                          [--no-draw]

Writes predictions (JSON for boxes, PNG label maps for masks) under OUT_DIR/preds for every image, and
visualisations (boxes or masks drawn on the image) under OUT_DIR/vis, through mmdet's DetInferencer / mmseg's
MMSegInferencer; ``--no-draw`` writes the predictions only (drawing a large photo costs far more time and memory
than predicting it: see docs/reliability.md), OUT_DIR/vis then holding no drawing of these images. The model
runs ``--batch-size`` images of similar size at a time, padded to the largest of the batch, in one call
(``adapters.inference.BatchedPredictions``; a line at the end says how many images were predicted in batches),
each predicted as it is alone (``adapters.alone.predict_alone``, with the configs' valid-size data
preprocessors), so a prediction does not depend on the batch; then each image's files are written in turn, in
place before the next image's, with the progress of a long run every few seconds. An image named twice is run
once. Outputs are named by the image's stem; images whose stems collide (a/x.png, b/x.png) are named by their
path under the inputs' common folder instead (a__x, b__x; ``adapters.inference.unique_names``), and those names
are printed first: no two images share an output. An image's outputs replace those an earlier run wrote under its
name. They are made in a staging folder under OUT_DIR (.staging-*, held by the run while it runs, then removed),
and each file is fsynced and renamed into place, so it appears whole or not at all; a run first removes the
staging folders that killed runs left there, in one line.

An image that cannot be run (an empty file, not an image, bytes OpenCV cannot decode, an image the test
pipeline cannot take, such as 5000 x 1 where resizing to the config's scale leaves no row) gets one line naming its
path and why, nothing written for it (the outputs an earlier run wrote under its name are removed and named in
that line), and the run goes on; such an image is left out of its batch, and any other error of a batch stops
the run with its traceback. The exit status is then 1, after a summary "N of M image(s) failed: PATHS", and 0
when every image ran. The backbones take any size down to 1 x 1; where a framework's visualiser cannot draw an
image (mmseg's fails on a 1 x 1 one), that image gets one line saying so, its prediction is written and it does
not count as failed.

CHECKPOINT must fit the config's model exactly: a checkpoint with missing, unexpected or mis-shaped keys (another
model's) is refused before its weights are loaded, with every such key listed, and nothing runs (exit status 1).
It is read through ``cpvt_backbones.convert.safe_load`` (a pickle that would run code is refused); one with NaN or
Inf weights is refused by key unless ``--allow-nonfinite`` (``adapters.inference.StrictWeights``). These refusals,
a checkpoint that cannot be read (missing, empty, truncated, corrupt), a setting our backbone does not take and
an output folder that cannot be written are one line on stderr naming the file, key or path (exit status 1).

Once the weights are loaded the model goes to ``--engine`` at ``--precision`` as in tools/test.py (default: our
backbone on the fused CPU kernels; the table at the end of ``--help``), the same predictions and drawings
otherwise.
"""
import argparse
import tempfile
from pathlib import Path

from mmengine.config import DictAction

from cpvt_backbones.adapters.alone import predict_alone
from cpvt_backbones.adapters.engines import IMAGE_SUFFIXES, add_engine_args, engine_model, engine_request
from cpvt_backbones.adapters.evaluation import set_test_scale
from cpvt_backbones.adapters.inference import (
    OUTPUT_KINDS,
    BatchedPredictions,
    StrictWeights,
    failing_as,
    run_each,
    unique_names,
)
from cpvt_backbones.adapters.runner import ConfigError, load_config, quiet_known_warnings
from cpvt_backbones.convert.loading import one_line_errors


def collect_images(inputs):
    """The image files of ``inputs`` (files as given, folders' files with an image extension, sorted), each
    file once."""
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
    kept = {}
    for f in files:
        kept.setdefault(f.resolve(), str(f))
    return list(kept.values())


class DrawOrSay:
    """Mixed in before an inferencer: images are drawn one at a time, and one its visualiser cannot draw is
    reported in one line, its prediction still written (inferencers draw an image before they save its
    prediction, so a failure to draw would lose it); with ``draw = False`` (``--no-draw``) none is drawn (nor
    read again for drawing), the predictions written as before."""

    draw = True

    def visualize(self, inputs, preds, **kwargs):
        if not self.draw:
            return None
        drawn = []
        for one, pred in zip(inputs, preds, strict=False):
            try:
                drawn.append(super().visualize([one], [pred], **kwargs))
            except Exception as e:  # any failure of drawing; the prediction is kept
                name = Path(one).name if isinstance(one, str) else 'an array'
                print(f'[infer] {name}: not drawn ({type(e).__name__}: {e}); prediction written')
        images = [img for out in drawn if out is not None for img in out]
        return images if kwargs.get('return_vis') else None


def writable_output(out_dir: str) -> None:
    """Make ``out_dir`` and check that a file can be written there, else exit naming the path and why (before any
    model is built)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for kind in OUTPUT_KINDS:
            if (out / kind).exists() and not (out / kind).is_dir():
                raise NotADirectoryError(20, 'Not a directory', str(out / kind))
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise SystemExit(f'infer.py: cannot write the outputs under {out} ({e.strerror or e}: '
                         f'{e.filename or out}); choose another --out-dir') from None


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
    parser.add_argument('--no-draw', action='store_true',
                        help='write the predictions only, no drawing (a large photo draws far slower than it runs)')
    parser.add_argument('--batch-size', type=int, default=8,
                        help='images the model runs at once (default 8), each predicted as alone; 1 runs one at a '
                             "time (also where the config's data preprocessor hands over no valid sizes)")
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    parser.add_argument('--allow-nonfinite', action='store_true',
                        help='run a checkpoint with NaN or Inf weights (refused by default)')
    add_engine_args(parser)
    args = parser.parse_args()
    if args.batch_size < 1:
        parser.error(f'--batch-size must be at least 1, got {args.batch_size}')
    quiet_known_warnings()
    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in: mmengine reads checkpoints with safe_load)

    with one_line_errors('infer.py', ConfigError):
        cfg = load_config(args.config, args.cfg_options)
    if cfg.default_scope not in ('mmdet', 'mmseg'):
        raise SystemExit(f'infer.py handles mmdet and mmseg configs; {args.config} is for {cfg.default_scope}')
    request = engine_request(cfg, args)
    if args.scale or args.native:
        set_test_scale(cfg, None if args.native else args.scale)
    images = collect_images(args.inputs)
    writable_output(args.out_dir)
    names = unique_names(images)
    renamed = [(image, name) for image, name in zip(images, names, strict=False) if name != Path(image).stem]
    if renamed:
        print(f'[infer] {len(renamed)} image(s) share a name with another; their outputs are named:')
        for image, name in renamed:
            print(f'[infer]   {image} -> {name}')
    drawing = dict(draw=not args.no_draw)
    with one_line_errors('infer.py'):
        if cfg.default_scope == 'mmdet':
            from mmdet.apis import DetInferencer
            inferencer = type('DetInferencer', (StrictWeights, DrawOrSay, DetInferencer), drawing)(
                model=cfg, weights=args.checkpoint, device=args.device, show_progress=False,
                allow_nonfinite=args.allow_nonfinite)

            def run(image, out_dir):
                inferencer([image], out_dir=out_dir, pred_score_thr=args.score_thr, no_save_pred=False)
        else:
            from mmseg.apis import MMSegInferencer
            inferencer = type('MMSegInferencer', (StrictWeights, DrawOrSay, MMSegInferencer), drawing)(
                model=cfg, weights=args.checkpoint, device=args.device, allow_nonfinite=args.allow_nonfinite)
            inferencer.show_progress = False

            def run(image, out_dir):
                inferencer([image], out_dir=out_dir, img_out_dir='vis', pred_out_dir='preds')
    inferencer.pipeline = failing_as('the test pipeline', inferencer.pipeline)
    engine_model(inferencer.model, cfg, args.checkpoint, request)
    batch_size = args.batch_size
    if batch_size > 1 and not getattr(inferencer.model.data_preprocessor, 'marks_valid_sizes', False):
        print(f"[infer] {args.config}: the data preprocessor hands over no valid sizes (ValidSizeDetDataPreprocessor, "
              'ValidSizeSegDataPreprocessor), so a batch would change the predictions: one image at a time')
        batch_size = 1
    batched = None
    if batch_size > 1:
        predict_alone(inferencer.model)
        batched = BatchedPredictions(inferencer)
    prefetch = batched.prefetch if batched is not None else None
    try:
        failed = run_each(run, images, names, args.out_dir, prefetch, batch_size)
    except OSError as e:
        raise SystemExit(f'infer.py: cannot write the outputs under {args.out_dir} ({e.strerror or e}: '
                         f'{e.filename or args.out_dir})') from None
    if batched is not None:
        alone = ', the others one at a time' if batched.batched < len(images) else ''
        print(f'[infer] {batched.batched} of {len(images)} image(s) predicted in {batched.calls} padded batch(es) '
              f'of up to {batch_size}{alone}')
    written = f'{args.out_dir}/preds' if args.no_draw else f'{args.out_dir}/vis, {args.out_dir}/preds'
    print(f'{len(images) - len(failed)} image(s) -> {written}')
    if failed:
        raise SystemExit(f'{len(failed)} of {len(images)} image(s) failed: {", ".join(failed)}')

if __name__ == '__main__':
    main()
