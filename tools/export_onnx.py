"""Export a backbone (or a whole detector/segmentor up to its heads' raw outputs) to ONNX, any input size.

    python tools/export_onnx.py NAME OUT.onnx [--checkpoint PATH] [--out-indices 0 1 2 3] [--no-sizes]
                                [--verify 224x224 ...]
    python tools/export_onnx.py CONFIG.py OUT.onnx --checkpoint PATH [--cfg-options k=v ...] [--verify ...]

NAME is a model of ``cpvt_backbones.list_models()``, exported as its ``features_only`` backbone (outputs
``stride4`` ... ``stride32``); ``--checkpoint`` loads any weight layout ``create_model(pretrained=...)`` takes.
Its file has two inputs, ``image`` (N x C x H x W, float32) and ``sizes`` (N x 2, int64: each image's valid height
and width in pixels, from the top-left of the padded batch), and gives each image of a padded batch what it gets
alone: on each image's region of every map (ceil(h / stride) x ceil(w / stride)) its maps alone, zeros beyond. A
batch of images of one size takes ``sizes`` filled with (H, W). ``--no-sizes`` writes the one-input file, which
takes padding as image (a padded batch changes each image's maps).
A config exports the model's ``tensor`` mode: RetinaNet gives ``cls_score_{level}`` and ``bbox_pred_{level}``,
a segmentor its ``seg_logits`` at 1/4 of the input; the data preprocessor (normalisation) stays outside, as
mmdeploy does. Batch, height and width are dynamic: the models pad internally, and while exporting they take
their padding path at every size, so one graph serves every size (``layers.layout.pad_to_multiple``).
``--verify`` runs the file with onnxruntime at the given sizes and prints the largest difference from PyTorch; a
file with ``sizes`` also runs all of them as one padded batch against each image alone in PyTorch.

The checkpoint must fit the model exactly, and hold no NaN or Inf weights: a model name's through
``create_model(pretrained=...)`` (``convert.load_into``), a config's through
``adapters.runner.load_checkpoint_strictly``. A checkpoint that does not fit (another model's, a detector's given
a model name), one that cannot be read (missing, empty, truncated, corrupt) and a setting our backbone does not
take are one line on stderr naming the file (exit status 1). OUT.onnx is written whole or not at all
(``cpvt_backbones.utils.atomic_path``: a temporary file beside it, renamed into place once complete).
"""
import argparse
import importlib.util
import sys
from collections.abc import Sequence

import torch
from torch import nn

from cpvt_backbones import create_model, list_models
from cpvt_backbones.convert.loading import one_line_errors
from cpvt_backbones.deploy.check import PerImagePathError
from cpvt_backbones.deploy.onnx import export, verify
from cpvt_backbones.deploy.registry import in_chans_of
from cpvt_backbones.utils import atomic_path


def _flat(item) -> list[torch.Tensor]:
    if isinstance(item, torch.Tensor):
        return [item]
    if isinstance(item, (tuple, list)):
        return [t for part in item for t in _flat(part)]
    raise TypeError(f'cannot export an output of type {type(item).__name__}')


class Flatten(nn.Module):
    """A model whose forward returns nested tuples/lists of tensors, as one flat tuple (ONNX outputs)."""

    def __init__(self, model: nn.Module, call):
        super().__init__()
        self.model = model
        self.call = call

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(_flat(self.call(self.model, x)))


def backbone(name: str, checkpoint: str = None, out_indices: Sequence[int] = (0, 1, 2, 3)):
    """(module, output names) for the features-only backbone of a model name (its forward takes ``valid_sizes``)."""
    model = create_model(name, pretrained=checkpoint, features_only=True, out_indices=tuple(out_indices))
    return model.eval(), [f'stride{s}' for s in model.strides]


def framework_model(config: str, checkpoint: str, cfg_options=None):
    """(module, output names) for a detector or segmentor config: its forward in ``tensor`` mode."""
    from mmengine.registry import MODELS, init_default_scope

    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in: mmengine reads checkpoints with safe_load)
    from cpvt_backbones.adapters.runner import load_checkpoint_strictly, load_config
    cfg = load_config(config, cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    model = MODELS.build(cfg.model)
    if checkpoint:
        load_checkpoint_strictly(model, checkpoint, f'checkpoint {checkpoint} (config {config})')
    model.eval()
    if cfg.default_scope == 'mmdet':
        levels = cfg.model.neck.num_outs
        names = [f'cls_score_{i}' for i in range(levels)] + [f'bbox_pred_{i}' for i in range(levels)]
    elif cfg.default_scope == 'mmseg':
        names = ['seg_logits']
    else:
        raise SystemExit(f'{config}: default_scope must be mmdet or mmseg, got {cfg.default_scope!r}')
    return Flatten(model, lambda m, x: m._forward(x)), names


def _size(text: str) -> tuple[int, int]:
    h, _, w = text.partition('x')
    try:
        return int(h), int(w or h)
    except ValueError:
        raise argparse.ArgumentTypeError(f'sizes are HxW or S, got {text!r}') from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('model', help=f'a model name ({", ".join(list_models())}) or a detector/segmentor config')
    parser.add_argument('out')
    parser.add_argument('--checkpoint')
    parser.add_argument('--out-indices', type=int, nargs='+', default=[0, 1, 2, 3], help='model names only')
    parser.add_argument('--no-sizes', action='store_true',
                        help='model names: a file with the one input image (padding taken as image)')
    parser.add_argument('--verify', type=_size, nargs='*', default=[], metavar='HxW')
    parser.add_argument('--cfg-options', nargs='+', default=None, help='configs only: key=value overrides')
    args = parser.parse_args()
    with one_line_errors('export_onnx.py', *_config_errors()):
        model, names = _model(parser, args)
    sized = not args.no_sizes and not args.model.endswith('.py')
    try:
        with atomic_path(args.out) as tmp:
            export(model, str(tmp), names, in_chans=in_chans_of(model, {}), sizes_input=sized)
    except PerImagePathError as e:
        sys.exit(f'export_onnx.py: {e} (--no-sizes exports it without)')
    inputs = 'image, sizes' if sized else 'image'
    print(f'[onnx] wrote {args.out} (inputs {inputs}; outputs {", ".join(names)}; dynamic batch, height, width)')
    if args.verify:
        verify(model, args.out, args.verify)


def _config_errors() -> tuple:
    if importlib.util.find_spec('mmengine') is None:
        return ()
    from cpvt_backbones.adapters.runner import ConfigError
    return (ConfigError,)


def _model(parser, args):
    if args.model.endswith('.py'):
        from mmengine.config import DictAction
        options = argparse.Namespace(cfg_options=None)
        if args.cfg_options:
            DictAction(option_strings=['--cfg-options'], dest='cfg_options')(parser, options, args.cfg_options)
        model, names = framework_model(args.model, args.checkpoint, options.cfg_options)
    elif args.model in list_models():
        model, names = backbone(args.model, args.checkpoint, args.out_indices)
    else:
        sys.exit(f'{args.model!r} is neither a config (.py) nor a model name ({", ".join(list_models())})')
    return model, names


if __name__ == '__main__':
    main()
