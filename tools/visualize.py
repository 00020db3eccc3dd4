"""Pictures of what a trained backbone does with one image: attention, what the PEGs add, and feature maps.

    python tools/visualize.py CHECKPOINT IMAGE [--model NAME] [--size W H] [--queries X,Y ...] [--out FILE]

CHECKPOINT is a classifier in any layout ``cpvt_backbones.convert`` reads, or an mmdet/mmseg/mmpretrain
checkpoint whose ``backbone.*`` keys are ours (its neck and heads are ignored). ``--model`` defaults to the
registered model whose layout the weights fit; the weights must fit that model exactly and be finite
(``convert.load_into``): a checkpoint that does not fit ``--model``, one with NaN or Inf weights and one that
cannot be read (missing, empty, truncated, corrupt) are one line naming the file (exit status 1). One PNG
(default: IMAGE's name + ``_cpvt.png``, written whole or not at all: ``cpvt_backbones.utils.atomic_path``) with
rows:

* attention of each query point (fractions X,Y of the width and height; marked on the image) over the keys
  of the last block of every stage (pyramid) or of four blocks (columnar), averaged over heads: the keys of a
  pyramid stage are its spatially reduced map, drawn at their place in the image;
* the position response of each PEG (the L2 norm of what it adds to each token), on a uniform grey image,
  where the tokens are all alike and only the zero padding at the border sets positions apart, and on the
  given image;
* the L2 norm of each feature map the model returns (dense backbone) or of each stage's output (classifier).

Everything is read through forward hooks on the plain model (``attn.q``, ``attn.kv``, ``pos_block.k``). The
attention is softmax(q k^T) of the projections' outputs: the model's own for the registered models (PEGs act
on the tokens, not inside attention); a model built with RoPE or a relative bias would attend otherwise.
"""
import argparse
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from cpvt_backbones import list_models
from cpvt_backbones.convert import built_weights, load_into, load_weights_file, to_native
from cpvt_backbones.convert.loading import compare, one_line_errors
from cpvt_backbones.models import CPVT, create_model
from cpvt_backbones.utils import atomic_path, pyplot, strip_prefix

MEAN = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
STD = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)


def backbone_weights(path: str) -> tuple[dict[str, torch.Tensor], bool]:
    """Our-layout weights of ``path`` and whether they are a dense backbone (a detector's, segmentor's or
    classifier's ``backbone.*`` part without our classification head)."""
    state = load_weights_file(path)
    if any(k.startswith('backbone.') for k in state) and any(not k.startswith(('backbone.', 'head.fc.'))
                                                              for k in state):
        state = strip_prefix(state, 'backbone.', path)
    state = to_native(state)
    return state, 'head.weight' not in state


def build(state: dict[str, torch.Tensor], dense: bool, name: str = None, source: str = 'checkpoint'):
    """The named model, or the first registered one whose layout the weights fit exactly, with the weights loaded
    strictly (``convert.load_into``: ``source`` names them in its errors)."""
    if dense:  # the levels a dense checkpoint holds: pyramid stages, or a columnar model's pyramid levels
        levels = {int(k.split('.')[1]) for k in state if k.startswith(('simple_fpn.', 'patch_embeds.'))}
        kwargs = dict(features_only=True, out_indices=tuple(sorted(levels)) or None)
    else:
        kwargs = dict(num_classes=state['head.weight'].shape[0])
    names = [name] if name else list_models()
    for candidate in names:
        with torch.device('meta'):
            probe = create_model(candidate, **kwargs)
        sd = built_weights(probe, state)
        if name or not compare(probe, sd):
            model = create_model(candidate, **kwargs)
            load_into(model, state, strict=True, source=source)
            return candidate, model.eval()
    raise SystemExit(f'the weights fit none of {names} (pass --model to see the mismatch)')


def read_image(path: str, size: Sequence[int] = None) -> tuple[np.ndarray, torch.Tensor]:
    from PIL import Image
    img = Image.open(path).convert('RGB')
    if size:
        img = img.resize(tuple(size), Image.BICUBIC)
    rgb = np.asarray(img)
    x = torch.from_numpy(rgb.copy()).permute(2, 0, 1)[None].float()
    return rgb, (x - MEAN) / STD


class Recorder:
    """Forward hooks that keep the queries and keys of chosen blocks and every PEG's input and output."""

    def __init__(self, model, blocks: Sequence[tuple[str, torch.nn.Module]]):
        self.qkv: dict[str, dict[str, torch.Tensor]] = {}
        self.peg: list[tuple[tuple[int, int], np.ndarray]] = []  # (token grid, what the PEG added per token)
        self.handles = []
        for label, block in blocks:
            slot = self.qkv.setdefault(label, {})
            for part in ('q', 'kv'):
                self.handles.append(getattr(block.attn, part).register_forward_hook(
                    lambda m, i, o, slot=slot, part=part: slot.__setitem__(part, o.detach())))
            self.handles.append(block.register_forward_hook(
                lambda m, args, o, slot=slot: slot.__setitem__('hw', tuple(args[1]))))
            slot['heads'] = block.attn.num_heads
            slot['sr'] = block.attn.sr_ratio
        for peg in getattr(model, 'pos_block', ()):
            self.handles.append(peg.register_forward_hook(self._peg))

    def _peg(self, module, args, out):
        hw = tuple(args[1])
        self.peg.append((hw, module.response(args[0].detach(), out.detach(), hw)[0].numpy()))

    def remove(self):
        for h in self.handles:
            h.remove()


def attention_map(slot, query: tuple[float, float], prefix: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Head-averaged attention of the token under ``query`` (fractions) over the keys, as a (h', w') grid of
    the (reduced) key map, and the query's token position."""
    h, w = slot['hw']
    qi, qj = min(int(query[1] * h), h - 1), min(int(query[0] * w), w - 1)
    q, kv, heads = slot['q'][0], slot['kv'][0], slot['heads']
    dim = q.shape[-1] // heads
    qv = q[prefix + qi * w + qj].view(heads, dim)
    k = kv[:, :q.shape[-1]].reshape(-1, heads, dim)
    attn = torch.softmax(torch.einsum('hd,mhd->hm', qv, k) * dim ** -0.5, dim=-1).mean(0)[prefix:]
    sr = slot['sr']
    kh, kw = math.ceil(h / sr), math.ceil(w / sr)
    return attn.view(kh, kw).numpy(), (qi, qj)


def taps(model) -> list[tuple[str, torch.nn.Module]]:
    """(label, block) whose attention is drawn: the last block of every stage, or four blocks of a column."""
    if isinstance(model, CPVT):
        n = len(model.blocks)
        picks = sorted({0, n // 3, 2 * n // 3, n - 1})
        return [(f'block {j}', model.blocks[j]) for j in picks]
    return [(f'stage {i + 1}, block {len(b) - 1}', b[-1]) for i, b in enumerate(model.blocks)]


def feature_maps(model, x: torch.Tensor) -> list[tuple[str, np.ndarray]]:
    if model.features_only:
        maps, strides = model(x), [f'stride {s}' for s in model.strides]
    else:
        n = len(model.feature_info)
        idx = sorted({0, n // 3, 2 * n // 3, n - 1}) if isinstance(model, CPVT) else list(range(n))
        maps = model.forward_intermediates(x, indices=idx, intermediates_only=True)
        strides = [f"{model.feature_info[i]['module']}, stride {model.feature_info[i]['reduction']}" for i in idx]
    return [(f'{s}: {m.shape[1]} ch, {m.shape[2]}x{m.shape[3]}', m[0].norm(dim=0).numpy())
            for s, m in zip(strides, maps, strict=False)]


def run(model, x: torch.Tensor):
    rec = Recorder(model, taps(model))
    try:
        with torch.no_grad():
            feats = feature_maps(model, x)
    finally:
        rec.remove()
    return rec, feats


def draw(rgb: np.ndarray, name: str, model, x: torch.Tensor, queries: list[tuple[float, float]], out: Path) -> None:
    plt = pyplot()

    rec, feats = run(model, x)
    const_rec, _ = run(model, (torch.full_like(x, 128.) - MEAN) / STD)
    prefix = getattr(model, 'num_prefix_tokens', 0)
    H, W = rgb.shape[:2]
    labels = list(rec.qkv)
    pegs = rec.peg[:4]
    cols = max(len(labels), len(pegs), len(feats))
    rows = len(queries) + 3
    colours = ['red', 'cyan', 'yellow', 'magenta', 'lime']
    fig, axes = plt.subplots(rows, cols + 1, figsize=(3.1 * (cols + 1), 2.9 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis('off')

    def heat(ax, data, title, extent=None, alpha=None):
        if alpha is not None:
            ax.imshow(rgb)
        im = ax.imshow(data, cmap='viridis', extent=extent, alpha=alpha, interpolation='nearest')
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03).ax.tick_params(labelsize=7)

    for r, query in enumerate(queries):
        ax = axes[r, 0]
        ax.imshow(rgb)
        ax.scatter([query[0] * W], [query[1] * H], s=80, c=colours[r % len(colours)], marker='x', linewidths=2.5)
        ax.set_title(f'query {r + 1} at ({query[0]:.2f}, {query[1]:.2f})', fontsize=9)
        for c, label in enumerate(labels):
            slot = rec.qkv[label]
            attn, (qi, qj) = attention_map(slot, query, prefix)
            h, w = slot['hw']
            stride_y, stride_x = H / h, W / w  # token pitch in image pixels
            kh, kw = attn.shape
            extent = (0, kw * slot['sr'] * stride_x, kh * slot['sr'] * stride_y, 0)
            heat(axes[r, c + 1], attn, f'{label}: attention\n(keys {kh}x{kw})', extent, alpha=0.65)
            axes[r, c + 1].set_xlim(0, W)
            axes[r, c + 1].set_ylim(H, 0)
            axes[r, c + 1].scatter([(qj + .5) * stride_x], [(qi + .5) * stride_y], s=60,
                                   c=colours[r % len(colours)], marker='x', linewidths=2)
    r = len(queries)
    axes[r, 0].text(0.5, 0.5, 'PEG response\non a uniform grey\nimage: the border\ncomes from the\nzero padding',
                    ha='center', va='center', fontsize=10)
    axes[r + 1, 0].text(0.5, 0.5, 'PEG response\non this image', ha='center', va='center', fontsize=10)
    for c, ((hw, on_grey), (_, on_image)) in enumerate(zip(const_rec.peg[:4], pegs, strict=False)):
        heat(axes[r, c + 1], on_grey, f'pos_block.{c}: |PEG(x)|, {hw[0]}x{hw[1]}')
        heat(axes[r + 1, c + 1], on_image, f'pos_block.{c}: |PEG(x)|, {hw[0]}x{hw[1]}')
    axes[r + 2, 0].text(0.5, 0.5, 'feature maps\n(L2 norm over channels)', ha='center', va='center', fontsize=10)
    for c, (title, data) in enumerate(feats):
        heat(axes[r + 2, c + 1], data, title)
    fig.suptitle(f'{name} on a {W}x{H} image', fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def parse_query(text: str) -> tuple[float, float]:
    try:
        x, y = (float(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'a query is X,Y as fractions of width and height, got {text!r}') from None
    if not (0 <= x <= 1 and 0 <= y <= 1):
        raise argparse.ArgumentTypeError(f'query fractions must be within 0..1, got {text!r}')
    return x, y


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint')
    parser.add_argument('image')
    parser.add_argument('--model', choices=list_models(), help='default: the model the weights fit')
    parser.add_argument('--size', nargs=2, type=int, metavar=('W', 'H'), help='resize the image first')
    parser.add_argument('--queries', nargs='+', type=parse_query, default=[(0.5, 0.5), (0.1, 0.1)],
                        metavar='X,Y', help='query points as fractions of width, height (default 0.5,0.5 0.1,0.1)')
    parser.add_argument('--out', help='PNG path (default: next to the image)')
    args = parser.parse_args(argv)
    if importlib.util.find_spec('mmengine') is not None:
        import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in that reads mmengine checkpoints)
    with one_line_errors('visualize.py'):
        state, dense = backbone_weights(args.checkpoint)
        name, model = build(state, dense, args.model, args.checkpoint)
    rgb, x = read_image(args.image, args.size)
    out = Path(args.out) if args.out else Path(args.image).with_name(Path(args.image).stem + '_cpvt.png')
    draw(rgb, name, model, x, args.queries, out)
    print(f'{name} ({"dense backbone" if model.features_only else "classifier"}) on {args.image} -> {out}')
    return out


if __name__ == '__main__':
    main()
