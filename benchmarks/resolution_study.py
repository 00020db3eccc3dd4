"""CPVT's position-encoding comparison and its resolution test, on real images (Fashion-MNIST).

    python -m benchmarks.resolution_study --name NAME [--variants ...] [--head cls|gap] [--image-size 14 --patch 2
        --test-sizes 14 20 28 42] [--seeds 0 1 2] [--shard K/N] [--out DIR]

One DeiT-style ``CPVT`` (``--depth`` blocks, ``--dim`` wide, patch ``--patch``, a class token or global average
pooling, ``--head``) is trained from scratch once per position encoding in ``VARIANTS`` (the rows of the
paper's ablation table, plus 2-D RoPE), with the same data subset, schedule, augmentation and seeds.

Training images are random resized crops (area ``--crop-scale``..1, aspect 3/4..4/3, flips) of the 28 px
originals, resampled to ``--image-size``; tests are the whole test images resized to ``--test-sizes``. Two
protocols follow from the sizes:

* ``--image-size 14 --patch 2`` (the paper's ImageNet protocol): training below the originals' resolution,
  so testing at 20 px (1.43x) and 28 px (2x) shows real extra detail, as ImageNet's 384 px tests do, and
  random crops make training objects look larger than in a whole test image (the FixRes effect); 42 px (3x)
  is upsampled;
* ``--image-size 28 --patch 4``: training at the originals' resolution, so every larger test is upsampled
  (no new detail, objects only cover more tokens).

Diagnostics, from the same models: a linear position probe (``position_probe``: how well relative token
position can be read from the final features at each test size), the first PEG's response on a blank and a
real image, and optionally the images centred on blank canvases (``--canvas-sizes``) and placed at 3 x 3
positions on one (``--placement-canvas``).

Resumable: every run (variant, seed) keeps a checkpoint per epoch and a result.json under --work-dir/NAME; a
rerun continues an interrupted run from its last epoch, skips finished ones, and runs only the tests a finished
run lacks (on its saved weights). ``--shard K/N`` takes every N-th run from the K-th (0-based), so N
single-thread processes can share a study; the outputs are written by whichever invocation finds every run
finished. Writes NAME.{json,csv,md,png} and NAME_{probe,peg_response[,placement]}.png under --out with the
per-seed numbers, mean and standard deviation, the paper's figure per variant, the command and the wall time.
"""
import argparse
import json
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from cpvt_backbones import CPVT
from cpvt_backbones.layers.position import peg_responses
from cpvt_backbones.datasets import load_fashion_mnist
from cpvt_backbones.datasets.fashion_mnist import DEFAULT_ROOT

from cpvt_backbones.utils import atomic_write, pyplot
from benchmarks.study_cnn import PatchCNN
from benchmarks.study_common import mean_std, parse_shard, run_meta, study_dir, write_csv

ROOT = Path(__file__).resolve().parents[1]
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training-set pixel statistics


class Variant(NamedTuple):
    label: str
    paper: float | None      # DeiT-tiny, ImageNet top-1 at 224 (CPVT paper); None: not in its table
    spec: Callable[[int, int], object]   # (training image size in px, patch) -> pos_encoding
    cnn: bool = False           # the positive control: study_cnn.PatchCNN instead of the ViT (spec unused)


# The rows of the CPVT paper's position-encoding ablation (DeiT-tiny on ImageNet, class token), in its order,
# then 2-D RoPE (Heo et al.) alone and with a PEG. "At -1" acts on the patch embedding's output; "after 0" on
# block 0's. The wide PEG's kernel spans the whole grid from any token (2 * grid - 1: the paper's 27 at 14 x 14).
VARIANTS: dict[str, Variant] = {
    'none': Variant('no position encoding', 68.2, lambda size, patch: 'none'),
    'learned': Variant('learned table, resized (DeiT)', 72.2,
                       lambda size, patch: dict(type='learned', img_size=size)),
    'sincos': Variant('2-D sin-cos table', 72.3, lambda size, patch: 'sincos'),
    'rpe': Variant('relative position bias (K = 8)', 70.5, lambda size, patch: dict(type='rpe', max_distance=8)),
    'peg_-1': Variant('PEG at -1', 70.6, lambda size, patch: dict(type='peg', positions=(-1,))),
    'peg_-1_wide': Variant('PEG at -1, (2g-1)^2 kernel', 72.5, lambda size, patch: dict(
        type='peg', positions=(-1,), kernel_size=2 * (size // patch) - 1)),
    'peg_0': Variant('PEG after block 0 (CPVT)', 72.4, lambda size, patch: dict(type='peg', positions=(0,))),
    'peg_0-5': Variant('PEG after blocks 0-5 (CPVT)', 73.4,
                       lambda size, patch: dict(type='peg', positions=tuple(range(6)))),
    'peg_frozen': Variant('PEG after 0, frozen random', 71.3,
                          lambda size, patch: dict(type='peg', positions=(0,), frozen=True)),
    'peg_qk': Variant('PEG on Q, K only (block 1)', 71.3, lambda size, patch: dict(type='peg_qk', positions=(1,))),
    'conv1x1': Variant('1x1 convs after every block', 68.6, lambda size, patch: 'conv1x1'),
    'learned+peg_0': Variant('learned table + PEG after 0', None, lambda size, patch: [
        dict(type='learned', img_size=size), dict(type='peg', positions=(0,))]),
    'rope_axial': Variant('RoPE-Axial', None, lambda size, patch: 'rope_axial'),
    'rope_mixed': Variant('RoPE-Mixed', None, lambda size, patch: 'rope_mixed'),
    'rope_mixed+peg_0': Variant('RoPE-Mixed + PEG after 0', None,
                                lambda size, patch: ['rope_mixed', dict(type='peg', positions=(0,))]),
    'cnn': Variant('CNN, no position encoding (control)', None, lambda size, patch: None, cnn=True),
}


@dataclass(frozen=True)
class StudyConfig:
    """A study's settings: one field per command-line option of the same name (``parse_args`` documents them),
    ``--shard`` as its two numbers and ``runs`` resolved to the name when not given."""
    data: Path
    variants: tuple[str, ...]
    head: str
    shard_index: int
    num_shards: int
    seeds: tuple[int, ...]
    train_images: int
    test_images: int
    image_size: int
    test_sizes: tuple[int, ...]
    canvas_sizes: tuple[int, ...]
    placement_canvas: int
    placement_images: int
    probe_images: int
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    drop_path: float
    crop_scale: float
    crop_resample: str
    test_resample: str
    decay_position: bool
    dim: int
    depth: int
    heads: int
    patch: int
    device: str
    tf32: str
    work_dir: Path
    out: Path
    name: str
    runs: str
    in_chans: int = 1          # the images' channels and classes (Fashion-MNIST: 1 and 10); other studies
    num_classes: int = 10      # of the same models replace them

    def run_dir(self, variant: str, seed: int) -> Path:
        """Where one (variant, seed) run keeps its checkpoints, weights and result.json."""
        return self.work_dir / self.runs / f'{variant}-seed{seed}'


def parse_args(argv: Sequence[str] | None = None) -> StudyConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', type=Path, default=DEFAULT_ROOT, help='directory with the Fashion-MNIST IDX files')
    p.add_argument('--variants', nargs='+', default=[v for v in VARIANTS if not VARIANTS[v].cnn],
                   choices=list(VARIANTS), help='default: every ViT variant (cnn, the control, only when named)')
    p.add_argument('--head', choices=('cls', 'gap'), default='cls', help='class token, or global average pooling')
    p.add_argument('--shard', default='0/1', help='K/N: run every N-th (variant, seed) from the K-th (0-based)')
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p.add_argument('--train-images', type=int, default=20000, help='a fixed random subset of the 60,000')
    p.add_argument('--test-images', type=int, default=5000, help='the first N of the 10,000')
    p.add_argument('--image-size', type=int, default=14, help='training resolution (the originals are 28 px)')
    p.add_argument('--test-sizes', type=int, nargs='+', default=[14, 20, 28, 42])
    p.add_argument('--canvas-sizes', type=int, nargs='*', default=[],
                   help='also test the training-size images centred on blank canvases of these sizes')
    p.add_argument('--placement-canvas', type=int, default=0,
                   help='accuracy by position: the images placed at 3 x 3 positions on a canvas this large '
                        '(0: skip)')
    p.add_argument('--placement-images', type=int, default=1000, help='the first N test images, per position')
    p.add_argument('--probe-images', type=int, default=1000,
                   help='position probe: fitted on the first half of the first N test images at the training size, '
                        'scored on the second half at every test size (0: skip)')
    p.add_argument('--epochs', type=int, default=4)
    p.add_argument('--batch-size', type=int, default=128)
    p.add_argument('--lr', type=float, default=1e-3)
    p.add_argument('--weight-decay', type=float, default=0.05)
    p.add_argument('--drop-path', type=float, default=0.1)
    p.add_argument('--crop-scale', type=float, default=0.25, help='smallest crop area of the random resized crop')
    p.add_argument('--crop-resample', choices=CROP_RESAMPLE, default='antialiased',
                   help='how training crops are resampled: antialiased when shrinking, as ImageNet pipelines do, '
                        'or one bilinear sample per pixel (aliased)')
    p.add_argument('--test-resample', choices=TEST_RESAMPLE, default='bilinear',
                   help='how test images are resized (antialiased when shrinking); a test-time choice: a study '
                        'that only changes it can reuse another\'s trained runs (--runs)')
    p.add_argument('--decay-position', action='store_true',
                   help='weight decay on the position encodings\' weights too (by default they are exempt, as in '
                        'DeiT, Twins and RoPE-ViT)')
    p.add_argument('--dim', type=int, default=64)
    p.add_argument('--depth', type=int, default=6)
    p.add_argument('--heads', type=int, default=2)
    p.add_argument('--patch', type=int, default=2)
    p.add_argument('--device', default='cpu', help='torch device to train and test on (cpu, cuda, ...)')
    p.add_argument('--tf32', choices=TF32, default='default',
                   help="TF32 in CUDA matrix products and cuDNN convolutions: 'on' (both), 'off' (neither: full "
                        "float32, as on a CPU), or PyTorch's default (cuDNN's on, the matrix products' off); "
                        'recorded in each result')
    p.add_argument('--work-dir', type=Path, default=study_dir('resolution_study'), help='runs go to WORK_DIR/RUNS/')
    p.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results')
    p.add_argument('--name', default='resolution_study', help='name of the outputs (and of the runs by default)')
    p.add_argument('--runs', default=None,
                   help='directory name of the trained runs under --work-dir (default: --name); studies that '
                        'differ only in test-time options share runs')
    args = p.parse_args(argv)
    shard_index, num_shards = parse_shard(p, args.shard)
    for size in [args.image_size] + args.test_sizes + args.canvas_sizes:
        if size % args.patch:
            p.error(f'size {size} is not a multiple of the patch size {args.patch} (the study avoids padding)')
    if args.image_size not in args.test_sizes:
        p.error(f'--test-sizes must include the training size {args.image_size} (changes are measured from it)')
    if args.head != 'gap' and any(VARIANTS[v].cnn for v in args.variants):
        p.error('variant cnn pools its feature map (no class token): it needs --head gap')
    if args.depth < 6 and 'peg_0-5' in args.variants:
        p.error(f'variant peg_0-5 needs --depth >= 6, got {args.depth}')
    if any(s <= args.image_size for s in args.canvas_sizes + [args.placement_canvas or args.image_size + 1]):
        p.error(f'--canvas-sizes and --placement-canvas must be larger than the training size {args.image_size}')
    if args.placement_canvas % args.patch:
        p.error(f'--placement-canvas {args.placement_canvas} is not a multiple of the patch size {args.patch}')
    if not 0 < args.crop_scale <= 1:
        p.error(f'--crop-scale must be in (0, 1], got {args.crop_scale}')
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()}  # immutable throughout
    del options['shard']
    options['runs'] = args.runs or args.name
    return StudyConfig(**options, shard_index=shard_index, num_shards=num_shards)


TF32 = ('default', 'on', 'off')


@contextmanager
def fp32_precision(mode: str):
    """TF32 in CUDA matrix products and cuDNN convolutions while the block runs: ``'on'``, ``'off'`` or
    ``'default'`` (PyTorch's settings left as they are); the previous settings come back on exit. Yields what
    is in force, ``{'matmul': ..., 'cudnn_conv': ...}`` (``'tf32'`` or ``'ieee'``; CPU arithmetic is unaffected)."""
    if mode not in TF32:
        raise ValueError(f'tf32 must be one of {TF32}, got {mode!r}')
    new_api = hasattr(torch.backends.cuda.matmul, 'fp32_precision')   # torch >= 2.9; the old flags before
    if new_api:
        flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        saved = [f.fp32_precision for f in flags]
        if mode != 'default':
            for f in flags:
                f.fp32_precision = 'tf32' if mode == 'on' else 'ieee'
        in_force = [f.fp32_precision if f.fp32_precision != 'none' else torch.backends.fp32_precision
                    for f in flags]
        in_force = ['tf32' if p == 'tf32' else 'ieee' for p in in_force]
    else:
        saved = [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
        if mode != 'default':
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == 'on'
        in_force = ['tf32' if on else 'ieee'
                    for on in (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)]
    try:
        yield dict(matmul=in_force[0], cudnn_conv=in_force[1])
    finally:
        if new_api:
            for f, value in zip((torch.backends.cuda.matmul, torch.backends.cudnn.conv), saved, strict=True):
                f.fp32_precision = value
        else:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def ensure_data(root: Path) -> None:
    """Stop in one line, naming how to get the data, when Fashion-MNIST is not under ``root``. The study installs
    nothing: ``make env`` (``tools/setup_env.sh``) installs Debian's package where it runs as root with apt-get."""
    try:
        load_fashion_mnist('test', root)
    except FileNotFoundError as e:
        raise SystemExit(f'[study] {e} (`make env` installs dataset-fashion-mnist when run as root with apt-get)') \
            from e


def load_split(root: Path, split: str, count: int, subset_seed: int = 0):
    """The first ``count`` images of a fixed permutation (the same subset for every variant and seed),
    normalised to (N, 1, 28, 28) float32."""
    images, labels = load_fashion_mnist(split, root)
    if count > len(images):
        raise SystemExit(f'[study] asked for {count} {split} images, the {split} split has {len(images)}')
    idx = np.random.default_rng(subset_seed).permutation(len(images))[:count] if split == 'train' \
        else np.arange(count)
    x = torch.from_numpy(images[idx].astype(np.float32) / 255.).unsqueeze(1)
    return (x - MEAN) / STD, torch.from_numpy(labels[idx])


CROP_RESAMPLE = ('antialiased', 'aliased')
TEST_RESAMPLE = ('bilinear', 'bicubic')


def random_boxes(batch: int, min_scale: float, gen: torch.Generator) -> torch.Tensor:
    """(batch, 5) random resized crop boxes in normalised coordinates (-1..1): centre x, centre y, half-width,
    half-height, and the horizontal flip (-1 or 1). Area ``min_scale``..1 of the image, aspect 3/4..4/3; a side
    that would leave the image is clamped to it, so the crop always lies inside."""
    u = torch.rand(batch, 5, generator=gen)
    area = min_scale + (1 - min_scale) * u[:, 0]
    log_ratio = math.log(3 / 4) + (math.log(4 / 3) - math.log(3 / 4)) * u[:, 1]
    w = (area * log_ratio.exp()).sqrt().clamp(max=1)
    h = (area / log_ratio.exp()).sqrt().clamp(max=1)
    cx, cy = (2 * u[:, 2] - 1) * (1 - w), (2 * u[:, 3] - 1) * (1 - h)
    return torch.stack((cx, cy, w, h, torch.where(u[:, 4] < 0.5, -1., 1.)), dim=1)


def filter_weights(centre: torch.Tensor, half: torch.Tensor, size: int, n_in: int) -> torch.Tensor:
    """(B, size, n_in): each output pixel of a crop as a weighted sum of input pixels, as torchvision's
    RandomResizedCrop makes it: the box (normalised centre and half-extent per image) rounded to whole pixels
    and cut out, then resized with the triangle (bilinear) filter, widened by the shrink factor where it shrinks
    and cut at the crop's edge, normalised (PIL's and ``F.interpolate(antialias=True)``'s resampling)."""
    length = (half * n_in).round().clamp(1, n_in)
    start = torch.minimum(((centre + 1) / 2 * n_in - length / 2).round().clamp(min=0), n_in - length)
    scale = length / size                                                 # input pixels per output pixel
    centres = start[:, None] + scale[:, None] * (torch.arange(size) + 0.5)
    pixels = torch.arange(n_in)
    weights = (1 - ((pixels + 0.5 - centres[..., None]) / scale.clamp(min=1)[:, None, None]).abs()).clamp(min=0)
    inside = (pixels >= start[:, None]) & (pixels < (start + length)[:, None])
    weights = weights * inside[:, None, :]
    return weights / weights.sum(-1, keepdim=True)


def resample_boxes(x: torch.Tensor, boxes: torch.Tensor, size: int, resample: str) -> torch.Tensor:
    """Each image's box (``random_boxes``' layout) resampled to ``size`` x ``size``. 'antialiased': as ImageNet
    pipelines do (``filter_weights``: whole-pixel crop, filtered when it shrinks); 'aliased': the exact box, one
    bilinear sample per output pixel (``grid_sample``), which skips input pixels when it shrinks."""
    if resample not in CROP_RESAMPLE:
        raise ValueError(f'crop resampling must be one of {CROP_RESAMPLE}, got {resample!r}')
    cx, cy, w, h, flip = boxes.unbind(1)
    if resample == 'aliased':
        theta = torch.zeros(len(boxes), 2, 3)
        theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w * flip, cx, h, cy
        grid = F.affine_grid(theta, [len(boxes), x.shape[1], size, size], align_corners=False).to(x.device)
        return F.grid_sample(x, grid, mode='bilinear', padding_mode='border', align_corners=False)
    rows = filter_weights(cy, h, size, x.shape[-2])
    cols = filter_weights(cx, w, size, x.shape[-1])
    cols = torch.where(flip[:, None, None] < 0, cols.flip(1), cols)
    return torch.einsum('bih,bchw,bjw->bcij', rows.to(x), x, cols.to(x))


def random_resized_crop(x: torch.Tensor, size: int, min_scale: float, gen: torch.Generator,
                        resample: str = 'antialiased') -> torch.Tensor:
    """Batched random resized crop plus horizontal flip (``random_boxes``), resampled by ``resample_boxes``.
    The boxes come from ``gen`` on the CPU, so a seed gives the same crops on every device and resampling."""
    return resample_boxes(x, random_boxes(x.shape[0], min_scale, gen), size, resample)


def resize(x: torch.Tensor, size: int, mode: str = 'bilinear') -> torch.Tensor:
    """Bilinear or bicubic, antialiased when shrinking (as PIL resizes ImageNet's test images)."""
    return x if x.shape[-1] == size else F.interpolate(x, size=(size, size), mode=mode, align_corners=False,
                                                       antialias=size < x.shape[-1])


def build_model(variant: str, config: StudyConfig) -> CPVT | PatchCNN:
    if VARIANTS[variant].cnn:
        return PatchCNN(config.dim, config.depth, config.patch, config.in_chans, config.num_classes)
    return CPVT(embed_dim=config.dim, depth=config.depth, num_heads=config.heads, patch_size=config.patch,
                in_chans=config.in_chans, num_classes=config.num_classes, class_token=config.head == 'cls',
                drop_path_rate=config.drop_path, pos_encoding=VARIANTS[variant].spec(config.image_size, config.patch))


def make_optimizer(model: CPVT, config: StudyConfig, total_steps: int):
    """AdamW without decay on biases, norms, the class token and (unless ``--decay-position``) the position
    encodings' weights; linear warm-up then cosine."""
    skip = model.no_weight_decay()
    if config.decay_position:
        skip = {n for n in skip if n == 'cls_token'}
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and n not in skip]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1 or n in skip]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=config.weight_decay), dict(params=rest, weight_decay=0.)],
                            lr=config.lr)
    warmup = max(1, total_steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def placements(config: StudyConfig) -> list[tuple[int, int]]:
    """Top-left pixel offsets (patch-aligned) of the image on the placement canvas: corners, edge middles, centre."""
    if not config.placement_canvas:
        return []
    free = config.placement_canvas - config.image_size
    steps = (0, (free // 2) // config.patch * config.patch, free)
    return [(r, c) for r in steps for c in steps]


def size_keys(config: StudyConfig) -> list[str]:
    """'56': the test images resized to 56 px (bilinear); 'bicubic56': the same with bicubic resizing;
    'canvas56': at the training size, centred on a blank 56 px canvas."""
    prefix = '' if config.test_resample == 'bilinear' else config.test_resample
    return [f'{prefix}{s}' for s in config.test_sizes] + [f'canvas{s}' for s in config.canvas_sizes]


def key_size(key: str) -> int:
    """The canvas or image size (px) of a ``size_keys`` key."""
    return int(key.removeprefix('canvas').removeprefix('bicubic'))


def placement_keys(config: StudyConfig) -> list[str]:
    """'place56@0,28': at 28 px on a blank 56 px canvas, top-left corner at row 0, column 28."""
    return [f'place{config.placement_canvas}@{r},{c}' for r, c in placements(config)]


def test_keys(config: StudyConfig) -> list[str]:
    return size_keys(config) + placement_keys(config)


def prepare(x: torch.Tensor, key: str, config: StudyConfig) -> torch.Tensor:
    """The test input for ``key`` (see ``test_keys``). Canvas tests put the image, at the training size, on a
    black canvas (the Fashion-MNIST background) at patch-aligned offsets, so the object falls on the same token
    grid as in training."""
    if key.startswith('place'):
        size, offsets = key[len('place'):].split('@')
        (top, left), total = map(int, offsets.split(',')), int(size) - config.image_size
    elif key.startswith('canvas'):
        total = int(key[len('canvas'):]) - config.image_size
        top = left = (total // 2) // config.patch * config.patch
    elif key.startswith('bicubic'):
        return resize(x, key_size(key), 'bicubic')
    else:
        return resize(x, int(key))
    return F.pad(resize(x, config.image_size), (left, total - left, top, total - top), value=-MEAN / STD)


@torch.inference_mode()
def evaluate(model: CPVT, x: torch.Tensor, y: torch.Tensor, keys: Sequence[str], config: StudyConfig,
             batch: int = 250):
    """Top-1 (%) for each test key; placement tests use the first ``--placement-images`` images."""
    model.eval()
    out = {}
    with fp32_precision(config.tf32):
        for key in keys:
            n = min(len(x), config.placement_images) if key.startswith('place') else len(x)
            xs, ys = x[:n], y[:n]
            correct = sum((model(prepare(xs[i:i + batch], key, config).to(config.device)).argmax(-1).cpu()
                           == ys[i:i + batch]).sum().item() for i in range(0, n, batch))
            out[key] = 100. * correct / n
    return out


@torch.inference_mode()
def position_probe(model: CPVT, x: torch.Tensor, config: StudyConfig) -> dict:
    """What the network knows about where a token is, at sizes it never saw.

    A ridge regression from the final patch-token features to the token's relative position in the image
    (row and column centres in 0..1, the same for a given piece of content at every size) is fitted on the
    first half of ``x`` at the training size and scored (R^2) on the second half at every test size. 'rows'
    holds, per test size, the mean predicted relative row of each token row (true centres in 'true_rows').
    A network that encodes relative position keeps R^2 near its 1x value; one that encodes distance from the
    border in tokens does not, since resizing changes that distance."""
    model.eval()
    half = len(x) // 2

    def tokens_and_targets(images: torch.Tensor, size: int):
        tokens = model.forward_features(resize(images, size).to(config.device))[:, model.num_prefix_tokens:].cpu()
        grid = size // config.patch
        centres = (torch.arange(grid) + 0.5) / grid
        target = torch.stack(torch.meshgrid(centres, centres, indexing='ij'), dim=-1).reshape(1, grid * grid, 2)
        return tokens.reshape(-1, tokens.shape[-1]), target.expand(len(images), -1, -1).reshape(-1, 2), grid

    features, targets, _ = tokens_and_targets(x[:half], config.image_size)
    features = torch.cat((features, torch.ones(len(features), 1)), dim=1).double()
    gram = features.T @ features
    weights = torch.linalg.solve(gram + 1e-3 * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype),
                                 features.T @ targets.double())
    out = dict(r2={}, rows={}, true_rows={})
    for size in config.test_sizes:
        features, targets, grid = tokens_and_targets(x[half:], size)
        pred = torch.cat((features, torch.ones(len(features), 1)), dim=1).double() @ weights
        residual = ((pred - targets) ** 2).sum()
        total = ((targets - targets.mean(dim=0)) ** 2).sum()
        out['r2'][str(size)] = round(float(1 - residual / total), 4)
        out['rows'][str(size)] = [round(float(v), 4) for v in pred[:, 0].reshape(-1, grid, grid).mean(dim=(0, 2))]
        out['true_rows'][str(size)] = [round((i + 0.5) / grid, 4) for i in range(grid)]
    return out


def train(variant: str, seed: int, config: StudyConfig, train_data, run_dir: Path):
    """Train one model, resuming from its last finished epoch; returns it with its training record (which
    records the TF32 settings in force, ``fp32_precision``)."""
    with fp32_precision(config.tf32) as in_force:
        model, record = _train(variant, seed, config, train_data, run_dir)
    return model, dict(record, tf32=in_force)


def _train(variant: str, seed: int, config: StudyConfig, train_data, run_dir: Path):
    x_train, y_train = (t.to(config.device) for t in train_data)
    torch.manual_seed(seed)
    model = build_model(variant, config).to(config.device)
    steps_per_epoch = len(x_train) // config.batch_size
    if steps_per_epoch < 1:
        raise SystemExit(f'[study] --batch-size {config.batch_size} is larger than --train-images {len(x_train)}')
    opt, sched = make_optimizer(model, config, steps_per_epoch * config.epochs)
    gen = torch.Generator().manual_seed(seed)
    state = dict(epoch=0, log=[], train_seconds=0.)
    ckpt_path = run_dir / 'checkpoint.pth'
    if ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, weights_only=False, map_location=config.device)
        model.load_state_dict(ckpt['model'])
        opt.load_state_dict(ckpt['optimizer'])
        sched.load_state_dict(ckpt['scheduler'])
        gen.set_state(ckpt['generator'].cpu())
        torch.set_rng_state(ckpt['torch_rng'].cpu())
        state = ckpt['state']
        print(f'[study] {variant} seed {seed}: resuming after epoch {state["epoch"]}', flush=True)
    for epoch in range(state['epoch'], config.epochs):
        model.train()
        start, loss_sum, correct = time.perf_counter(), 0., 0
        order = torch.randperm(len(x_train), generator=gen)
        for step in range(steps_per_epoch):
            idx = order[step * config.batch_size:(step + 1) * config.batch_size]
            idx = idx.to(config.device)
            xb = random_resized_crop(x_train[idx], config.image_size, config.crop_scale, gen, config.crop_resample)
            yb = y_train[idx]
            logits = model(xb)
            loss = F.cross_entropy(logits, yb, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            correct += (logits.argmax(-1) == yb).sum().item()
        seconds = time.perf_counter() - start
        state['epoch'] = epoch + 1
        state['train_seconds'] += seconds
        state['log'].append(dict(epoch=epoch + 1, loss=round(loss_sum / steps_per_epoch, 4),
                                 train_top1=round(100. * correct / (steps_per_epoch * config.batch_size), 2),
                                 seconds=round(seconds, 1)))
        print(f'[study] {variant} seed {seed}: {state["log"][-1]}', flush=True)
        ckpt = dict(model=model.state_dict(), optimizer=opt.state_dict(), scheduler=sched.state_dict(),
                    generator=gen.get_state(), torch_rng=torch.get_rng_state(), state=state)
        atomic_write(ckpt_path, lambda f, ckpt=ckpt: torch.save(ckpt, f))
    atomic_write(run_dir / 'final.pth', lambda f: torch.save(model.state_dict(), f))
    record = dict(variant=variant, seed=seed, device=config.device, top1={}, epochs=config.epochs,
                  iterations=steps_per_epoch * config.epochs,
                  params=sum(p.numel() for p in model.parameters()), train_seconds=round(state['train_seconds'], 1),
                  eval_seconds=0., log=state['log'])
    return model, record


def run(variant: str, seed: int, config: StudyConfig, data, run_dir: Path) -> dict:
    """One (variant, seed): trained once, then tested on every test this invocation asks for. result.json
    caches both; a test it lacks is run on the saved final weights, so tests can be added to a finished study.
    Where the weights are gone (result.json is kept in git, weights are not), the run is trained again and
    every test of its old result is run again with the new ones on the new weights, so that a result always
    comes from one training (another study sharing the run, such as a test-only variant of a recipe, keeps its
    tests)."""
    result_path = run_dir / 'result.json'
    model, result = None, json.loads(result_path.read_text()) if result_path.is_file() else None
    probe_sizes = [str(s) for s in config.test_sizes]
    earlier_tests: list[str] = []
    if result is not None and not (run_dir / 'final.pth').is_file() and (
            any(k not in result['top1'] for k in test_keys(config))
            or (config.probe_images and sorted(result.get('probe', {}).get('r2', {})) != sorted(probe_sizes))):
        print(f'[study] {variant} seed {seed}: a test is missing and the weights are not here (result.json is '
              'kept in git, weights are not): trained again, its earlier tests run again', flush=True)
        earlier_tests, result = list(result['top1']), None
    if result is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        model, result = train(variant, seed, config, data[0], run_dir)

    def trained() -> CPVT:
        if model is not None:
            return model
        saved = build_model(variant, config)
        saved.load_state_dict(torch.load(run_dir / 'final.pth', map_location='cpu'))
        return saved.to(config.device)

    missing = [k for k in dict.fromkeys(earlier_tests + test_keys(config)) if k not in result['top1']]
    changed = bool(missing)
    if missing:
        model = trained()
        start = time.perf_counter()
        result['top1'].update(evaluate(model, *data[1], missing, config))
        result['eval_seconds'] = round(result['eval_seconds'] + time.perf_counter() - start, 1)
        print(f'[study] {variant} seed {seed}: top-1 ' + ', '.join(f'{k} {result["top1"][k]:.2f}' for k in missing),
              flush=True)
    if config.probe_images and sorted(result.get('probe', {}).get('r2', {})) != sorted(probe_sizes):
        with fp32_precision(config.tf32):
            result['probe'] = position_probe(trained(), data[1][0][:config.probe_images], config)
        changed = True
        print(f'[study] {variant} seed {seed}: position probe R^2 {result["probe"]["r2"]}', flush=True)
    if changed:
        atomic_write(result_path, json.dumps(result, indent=2).encode())
    return result


def summarise(results: list[dict], config: StudyConfig) -> list[dict]:
    """One row per (variant, test): per-seed top-1, mean, standard deviation, and the change from the
    training size (paired by seed)."""
    rows = []
    for variant in config.variants:
        runs = sorted((r for r in results if r['variant'] == variant), key=lambda r: r['seed'])
        keys = size_keys(config)
        base = keys[config.test_sizes.index(config.image_size)]
        for key in keys:
            size = key_size(key)
            accs = [r['top1'][key] for r in runs]
            (m, s), (dm, ds) = mean_std(accs), mean_std([r['top1'][key] - r['top1'][base] for r in runs])
            rows.append(dict(variant=variant, test='canvas' if key.startswith('canvas') else 'resize', size=size,
                             factor=round(size / config.image_size, 2), grid=size // config.patch, top1_mean=m,
                             top1_std=s, change_mean=dm, change_std=ds, top1_per_seed=[round(a, 2) for a in accs],
                             seeds=[r['seed'] for r in runs]))
    return rows


def line_style(variant: str, plt) -> dict:
    """A colour of its own per encoding (up to 20), the line by family: PEGs solid, tables dashed, RoPE
    dash-dotted, the rest dotted."""
    family = ('-' if variant.startswith('peg') else '--' if variant.startswith(('learned', 'sincos')) else
              '-.' if variant.startswith('rope') else ':')
    return dict(color=plt.cm.tab20(list(VARIANTS).index(variant) % 20), ls=family, marker='o', ms=4)


def plot(rows: list[dict], config: StudyConfig, path: Path) -> None:
    plt = pyplot()
    train_grid = config.image_size // config.patch
    panels = [('resize', 'top1', 'top-1 (%)', 'images resized'),
              ('resize', 'change', f'change from {train_grid} x {train_grid} (points)', 'images resized')]
    if config.canvas_sizes:
        panels.append(('canvas', 'change', f'change from {train_grid} x {train_grid} (points)',
                       f'{config.image_size} px images centred on a blank canvas'))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (test, value, ylabel, title) in zip(axes[0], panels, strict=False):
        for variant in config.variants:
            r = [row for row in rows if row['variant'] == variant and (row['test'] == test or
                                                                       row['size'] == config.image_size)]
            ax.errorbar([row['grid'] for row in r], [row[f'{value}_mean'] for row in r],
                        yerr=[row[f'{value}_std'] for row in r], capsize=3, label=VARIANTS[variant].label,
                        **line_style(variant, plt))
        ax.axvline(train_grid, color='grey', ls=':', lw=1)
        if value == 'change':
            ax.axhline(0, color='black', lw=0.8)
        ax.set_xlabel('test token grid (side); training grid dotted')
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(sorted({row['grid'] for row in rows}))
        ax.grid(alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc='center left', bbox_to_anchor=(1, 0.5), fontsize=8)
    fig.suptitle(f'Fashion-MNIST, trained at {config.image_size} px ({train_grid} x {train_grid} tokens), tested '
                 f'without fine-tuning; mean +- std over {len(rows[0]["seeds"])} seeds', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def summarise_placements(results: list[dict], config: StudyConfig) -> list[dict]:
    rows = []
    for variant in config.variants:
        runs = sorted((r for r in results if r['variant'] == variant), key=lambda r: r['seed'])
        for (top, left), key in zip(placements(config), placement_keys(config), strict=False):
            accs = [r['top1'][key] for r in runs]
            m, sd = mean_std(accs)
            rows.append(dict(variant=variant, canvas=config.placement_canvas, top=top, left=left, top1_mean=m,
                             top1_std=sd, top1_per_seed=[round(a, 2) for a in accs]))
    return rows


def plot_placements(rows: list[dict], config: StudyConfig, path: Path) -> None:
    plt = pyplot()
    offsets = sorted({row['top'] for row in rows})
    fig, axes = plt.subplots(1, len(config.variants), figsize=(3.3 * len(config.variants) + 1, 3.6), squeeze=False)
    for ax, variant in zip(axes[0], config.variants, strict=False):
        cells = {(row['top'], row['left']): row for row in rows if row['variant'] == variant}
        grid = np.array([[cells[(r, c)]['top1_mean'] for c in offsets] for r in offsets])
        image = ax.imshow(grid, vmin=0, vmax=100, cmap='viridis')
        for i, r in enumerate(offsets):
            for j, c in enumerate(offsets):
                ax.text(j, i, f'{cells[(r, c)]["top1_mean"]:.0f}\n±{cells[(r, c)]["top1_std"]:.0f}', ha='center',
                        va='center', fontsize=8, color='white' if grid[i, j] < 60 else 'black')
        ax.set_xticks(range(len(offsets)), [f'x={c}' for c in offsets], fontsize=7)
        ax.set_yticks(range(len(offsets)), [f'y={r}' for r in offsets], fontsize=7)
        ax.set_title(VARIANTS[variant].label, fontsize=8)
    fig.colorbar(image, ax=axes[0].tolist(), label='top-1 (%)', shrink=0.85)
    fig.suptitle(f'Accuracy by position: {config.image_size} px images at 3 x 3 offsets (px) on a blank '
                 f'{config.placement_canvas} px canvas (trained at {config.image_size} px, no canvas); '
                 f'{config.placement_images} images, mean ± std over seeds', fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def summarise_probe(results: list[dict], config: StudyConfig) -> list[dict]:
    rows = []
    for variant in config.variants:
        runs = sorted((r for r in results if r['variant'] == variant and 'probe' in r), key=lambda r: r['seed'])
        for size in map(str, config.test_sizes if runs else []):
            r2 = [r['probe']['r2'][size] for r in runs]
            m, sd = mean_std(r2, digits=3)
            rows.append(dict(variant=variant, size=int(size), r2_mean=m, r2_std=sd, r2_per_seed=r2,
                             true_rows=runs[0]['probe']['true_rows'][size],
                             predicted_rows=[round(statistics.mean(v), 4)
                                             for v in zip(*(r['probe']['rows'][size] for r in runs), strict=False)]))
    return rows


def plot_probe(rows: list[dict], config: StudyConfig, path: Path) -> None:
    plt = pyplot()
    cols = min(5, len(config.variants))
    nrows = -(-len(config.variants) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(config.variants):]:
        ax.axis('off')
    for ax, variant in zip(axes.flat, config.variants, strict=False):
        for row in (r for r in rows if r['variant'] == variant):
            ax.plot(row['true_rows'], row['predicted_rows'], marker='.',
                    label=f'{row["size"]} px ({row["size"] // config.patch}x{row["size"] // config.patch}): '
                          f'R² {row["r2_mean"]:.2f}')
        ax.plot([0, 1], [0, 1], color='grey', ls=':', lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel('true relative row of the token')
        ax.set_title(VARIANTS[variant].label, fontsize=8)
        ax.legend(fontsize=6.5, loc='upper left')
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel('position read from its features')
    fig.suptitle('Linear position probe: fitted on final token features at the training size, applied at larger '
                 'sizes (mean over seeds)', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def peg_response(model: CPVT, x: torch.Tensor) -> torch.Tensor:
    """What the first PEG adds to each token of the first image (``peg_responses``), an (h, w) map."""
    model.eval()
    return peg_responses(model, x)[0][0]


def plot_peg_response(config: StudyConfig, test_image: torch.Tensor, path: Path) -> None:
    """For each PEG variant (lowest seed): the first PEG's response on a blank image and on a test image, at the
    training size and at 2x (resized and on a canvas)."""
    plt = pyplot()
    seed = min(config.seeds)
    variants = [v for v in ('peg_0', 'peg_0-5', 'peg_-1_wide') if v in config.variants
                and (config.run_dir(v, seed) / 'final.pth').is_file()]
    if not variants:
        print(f'[study] no PEG run of seed {seed} has its weights here: {path.name} not drawn')
        return
    big = 2 * config.image_size
    test_image = resize(test_image, config.image_size)
    blank = torch.full_like(test_image, -MEAN / STD)
    inputs = [('blank, 1x', blank), (f'blank, {big} px', resize(blank, big)), ('test image, 1x', test_image),
              (f'test image resized to {big} px', resize(test_image, big)),
              (f'test image on a {big} px canvas', prepare(test_image, f'canvas{big}', config))]
    fig, axes = plt.subplots(len(variants), len(inputs), figsize=(3.1 * len(inputs), 3 * len(variants)),
                             squeeze=False)
    for row, variant in zip(axes, variants, strict=False):
        model = build_model(variant, config)
        model.load_state_dict(torch.load(config.run_dir(variant, seed) / 'final.pth', map_location='cpu'))
        maps = [peg_response(model, x).numpy() for _, x in inputs]
        vmax = max(float(m.max()) for m in maps)
        for ax, (label, _), response in zip(row, inputs, maps, strict=False):
            image = ax.imshow(response, vmin=0, vmax=vmax, cmap='magma')
            ax.set_title(label, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        row[0].set_ylabel(f'{variant}, seed {seed}', fontsize=8)
        fig.colorbar(image, ax=row.tolist(), shrink=0.8, label='|PEG output| per token')
    fig.suptitle("What the first PEG adds to each token (its zero-padded convolution's output, L2 norm)",
                 fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def paper(variant: str) -> str:
    value = VARIANTS[variant].paper
    return '—' if value is None else f'{value:.1f}'


def trained_on(results: list[dict]) -> str:
    """Where the runs trained: one device, or each device with its runs when runs that share a study (seeds
    added later, a study over runs of several) trained on different ones."""
    by_device: dict[str, list[str]] = {}
    for r in results:
        by_device.setdefault(r['device'], []).append(f'{r["variant"]} seed {r["seed"]}')
    if len(by_device) == 1:
        return next(iter(by_device))
    return ' and '.join(f'{device} ({len(runs)} run{"s" * (len(runs) > 1)}: {", ".join(runs)})'
                        for device, runs in by_device.items())


def write_outputs(rows: list[dict], results: list[dict], config: StudyConfig, meta: dict) -> None:
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / f'{config.name}.csv')
    placement, probe = summarise_placements(results, config), summarise_probe(results, config)
    (out / f'{config.name}.json').write_text(json.dumps(dict(meta=meta, rows=rows, placement=placement, probe=probe,
                                                           runs=results), indent=2))

    def heading(key):
        size = key_size(key)
        grid = f'{size // config.patch}x{size // config.patch}'
        return f'canvas {size} px, {grid}' if key.startswith('canvas') else \
            f'{size} px, {grid} ({size / config.image_size:.2g}x)'
    keys = size_keys(config)
    lines = ['| position encoding | paper (DeiT-tiny, ImageNet) | ' + ' | '.join(heading(k) for k in keys) + ' |',
             '|---|---|' + '---|' * len(keys)]
    for variant in config.variants:
        cells = []
        for row in (r for r in rows if r['variant'] == variant):
            cell = f'{row["top1_mean"]:.2f} ± {row["top1_std"]:.2f}'
            if row['size'] != config.image_size:
                cell += f' ({row["change_mean"]:+.2f} ± {row["change_std"]:.2f})'
            cells.append(cell)
        lines.append(f'| {VARIANTS[variant].label} | {paper(variant)} | ' + ' | '.join(cells) + ' |')
    if placement:
        spots = placements(config)
        lines += ['', f'Accuracy by position on a blank {config.placement_canvas} px canvas (top-left offset y,x '
                  f'in px; first {config.placement_images} test images):', '',
                  '| position encoding | ' + ' | '.join(f'{r},{c}' for r, c in spots) + ' |',
                  '|---|' + '---|' * len(spots)]
        for variant in config.variants:
            lines.append(f'| {VARIANTS[variant].label} | ' + ' | '.join(
                f'{row["top1_mean"]:.1f} ± {row["top1_std"]:.1f}' for row in placement
                if row['variant'] == variant) + ' |')
    if probe:
        lines += ['', f'Position probe R² (relative token position read linearly from the final features; fitted at '
                  f'{config.image_size} px on {config.probe_images // 2} images, scored on {config.probe_images // 2} '
                  'others):',
                  '', '| position encoding | ' + ' | '.join(f'{s} px' for s in config.test_sizes) + ' |',
                  '|---|' + '---|' * len(config.test_sizes)]
        for variant in config.variants:
            lines.append(f'| {VARIANTS[variant].label} | ' + ' | '.join(
                f'{row["r2_mean"]:.3f} ± {row["r2_std"]:.3f}' for row in probe if row['variant'] == variant) + ' |')
    table = '\n'.join(lines)
    grid = config.image_size // config.patch
    (out / f'{config.name}.md').write_text(
        table + f'\n\nTop-1 (%) on {meta["test_images"]} Fashion-MNIST test images, mean ± standard deviation over '
        f'seeds {meta["seeds"]} (in brackets: change from the training size, paired by seed); head: '
        f'{"class token" if config.head == "cls" else "global average pooling"}. Trained on random resized crops '
        f'(area {config.crop_scale}-1, resampled {config.crop_resample}) of the 28 px originals at '
        f'{config.image_size} px (patch {config.patch}: a {grid} x {grid} token grid), '
        f'{config.dim} wide with {config.heads} heads, peak learning rate {config.lr:g}, weight decay '
        f'{config.weight_decay:g} (position encodings {"included" if config.decay_position else "exempt"}), '
        f'on {meta["train_images"]} images for {config.epochs} epochs ({meta["iterations"]} iterations) on '
        f'{meta["trained_on"]}; tested on the whole images resized ({config.test_resample}). '
        + (f'"canvas": the {config.image_size} px image centred on a blank canvas. ' if config.canvas_sizes else '')
        + f'The paper column is DeiT-tiny\'s '
        f'ImageNet top-1 at 224 from the CPVT paper\'s ablations (—: not in its tables here). Parameters: '
        f'{meta["params"]}. Run time summed over the runs: {meta["run_minutes"]} min (training '
        f'{meta["train_minutes"]}, testing {meta["test_minutes"]}); this invocation: {meta["wall_minutes"]} min.'
        f'\n\n`{meta["command"]}`\n')
    plot(rows, config, out / f'{config.name}.png')
    if placement:
        plot_placements(placement, config, out / f'{config.name}_placement.png')
    if probe:
        plot_probe(probe, config, out / f'{config.name}_probe.png')
    print(table)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    config = parse_args(argv)
    ensure_data(config.data)
    start = time.perf_counter()
    data = (load_split(config.data, 'train', config.train_images),
            load_split(config.data, 'test', config.test_images))
    runs = [(v, seed) for seed in config.seeds for v in config.variants]
    for variant, seed in runs[config.shard_index::config.num_shards]:
        run(variant, seed, config, data, config.run_dir(variant, seed))
    pending = [f'{v}-seed{s}' for v, s in runs if not (config.run_dir(v, s) / 'result.json').is_file()]
    if pending:
        print(f'[study] this shard is done; {len(pending)} run(s) of other shards pending ({", ".join(pending[:6])}'
              f'{" ..." if len(pending) > 6 else ""}): outputs are written once every run has finished')
        return []
    results = [run(v, seed, config, data, config.run_dir(v, seed)) for v, seed in runs]
    rows = summarise(results, config)
    meta = dict(run_meta('benchmarks.resolution_study', argv, start), dataset='Fashion-MNIST',
                train_images=config.train_images, test_images=config.test_images, image_size=config.image_size,
                test_sizes=list(config.test_sizes), canvas_sizes=list(config.canvas_sizes), seeds=list(config.seeds),
                epochs=config.epochs,
                iterations=results[0]['iterations'], batch_size=config.batch_size, lr=config.lr,
                weight_decay=config.weight_decay, drop_path=config.drop_path, crop_scale=config.crop_scale,
                crop_resample=config.crop_resample, test_resample=config.test_resample,
                decay_position=config.decay_position, device=config.device, trained_on=trained_on(results),
                runs=config.runs,
                model=dict(dim=config.dim, depth=config.depth, heads=config.heads, patch=config.patch,
                           head=config.head),
                params={r['variant']: r['params'] for r in results},
                run_minutes=round(sum(r['train_seconds'] + r['eval_seconds'] for r in results) / 60, 1),
                train_minutes=round(sum(r['train_seconds'] for r in results) / 60, 1),
                test_minutes=round(sum(r['eval_seconds'] for r in results) / 60, 1))
    write_outputs(rows, results, config, meta)
    if any(v in config.variants for v in ('peg_0', 'peg_0-5', 'peg_-1_wide')):
        plot_peg_response(config, data[1][0][:1], config.out / f'{config.name}_peg_response.png')
    print(f'[study] {meta["wall_minutes"]} min; results in {config.out}')
    return rows


if __name__ == '__main__':
    main()
