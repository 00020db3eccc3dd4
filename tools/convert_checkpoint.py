"""Convert a weight file between layouts (native: ours = official Twins/CPVT = timm; mmseg; mmpretrain; DeiT).

    python tools/convert_checkpoint.py SRC DST [--to native|backbone|mmseg|mmpretrain|rope_vit] [--prefix backbone.]
                                       [--drop-pos-embed] [--check MODEL_NAME]

SRC may be wrapped (``state_dict``/``model``/``module``) and may be ``.safetensors``; it is read with
``weights_only=True`` (``convert.safe_load``; where mmengine is installed, an mmengine checkpoint's log buffers and
numpy values, written on numpy 1.x or 2, are allowed: the checkpoint opt-in). A file that cannot be read, a pickle
that would run code, weights in no layout we read (a whole detector's without ``--prefix``) and weights that do
not fit ``--check`` are one line naming the file (exit status 1).
``--prefix`` keeps only the keys under it (a detector's or classifier's backbone).
``--to backbone`` writes the native layout without the classifier head, for a dense config's ``init_cfg``.
``--check`` loads the result strictly into ``create_model(MODEL_NAME)`` first (in the native layout, before
writing another). Weights that the ``--to`` layout cannot hold (a PVTv2 checkpoint ``--to mmseg``, whose layout
has only PCPVT and SVT backbones) are one line naming the file, its family and the keys (exit status 1). DST is
``.safetensors`` or a ``torch.save`` file holding ``{'state_dict': ...}``, written whole or not at all
(``cpvt_backbones.utils.atomic_path``: a temporary file beside it, renamed into place once complete).
"""
import argparse
import importlib.util
from pathlib import Path

import torch

from cpvt_backbones import create_model
from cpvt_backbones.convert import (
    UnknownKeysError,
    UnknownLayoutError,
    detect_layout,
    from_native,
    load_into,
    load_weights_file,
    to_native,
)
from cpvt_backbones.convert.loading import FAMILIES, checkpoint_family, one_line_errors
from cpvt_backbones.utils import atomic_path, atomic_write, strip_prefix


def checking_model(name: str, state: dict):
    """The variant of ``name`` that the weights claim to be: a classifier, a headless one, or a dense backbone
    (no final norm either: mmseg's layout)."""
    if any(k.startswith('head.') for k in state):
        return create_model(name)
    if any(k.startswith('norm.') for k in state):
        return create_model(name, num_classes=0)
    return create_model(name, features_only=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src')
    parser.add_argument('dst')
    parser.add_argument('--to', default='native', choices=['native', 'backbone', 'mmseg', 'mmpretrain', 'rope_vit'])
    parser.add_argument('--prefix', help='keep only keys under this prefix, stripped (e.g. backbone.)')
    parser.add_argument('--drop-pos-embed', action='store_true',
                        help="discard a DeiT checkpoint's position embedding (CPVT has none)")
    parser.add_argument('--check', metavar='MODEL_NAME', help='strictly load into this model before writing')
    args = parser.parse_args()

    if importlib.util.find_spec('mmengine') is not None:
        import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in that reads mmengine checkpoints)
    with one_line_errors('convert_checkpoint.py'):
        state = load_weights_file(args.src)
    if args.prefix:
        try:
            state = strip_prefix(state, args.prefix, args.src)
        except ValueError as err:
            raise SystemExit(str(err)) from None
    try:
        layout = detect_layout(state)
        ours = to_native(state, drop_pos_embed=args.drop_pos_embed)
    except UnknownLayoutError as e:
        raise SystemExit(f'convert_checkpoint.py: {args.src}: {e}') from None
    if args.check:
        with one_line_errors('convert_checkpoint.py'):
            load_into(checking_model(args.check, ours), ours, strict=True, source=args.src)
    try:
        out = from_native(ours, args.to)
    except UnknownKeysError as e:
        family = checkpoint_family(ours)
        what = f'a {FAMILIES[family][0]} checkpoint' if family else 'these weights'
        raise SystemExit(f'convert_checkpoint.py: {args.src} is {what}, which the {args.to} layout cannot hold: '
                         f'{e}') from None
    dst = Path(args.dst)
    if dst.suffix == '.safetensors':
        from safetensors.torch import save_file
        with atomic_path(dst) as tmp:
            save_file({k: v.contiguous() for k, v in out.items()}, str(tmp))
    else:
        atomic_write(dst, lambda f: torch.save({'state_dict': out}, f))
    print(f'{args.src} ({layout}, {len(state)} keys) -> {dst} ({args.to}, {len(out)} keys)')


if __name__ == '__main__':
    main()
