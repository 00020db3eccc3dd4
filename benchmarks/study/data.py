"""The study's data: Fashion-MNIST's fixed subsets, normalised, and the resampling every study shares (batched
random resized crops as ImageNet pipelines make them, blur-up, and test resizing)."""
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.study.config import CROP_AREA, CROP_RESAMPLE
from cpvt_backbones.datasets import load_fashion_mnist

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training-set pixel statistics


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


def random_boxes(batch: int, min_scale: float, gen: torch.Generator, area: str = 'uniform') -> torch.Tensor:
    """(batch, 5) random resized crop boxes in normalised coordinates (-1..1): centre x, centre y, half-width,
    half-height, and the horizontal flip (-1 or 1). Area ``min_scale``..1 of the image, uniform (``'uniform'``, as
    ImageNet pipelines draw it) or log-uniform (``'log'``: every zoom factor equally likely), aspect 3/4..4/3; a
    side that would leave the image is clamped to it, so the crop always lies inside."""
    if area not in CROP_AREA:
        raise ValueError(f'crop area must be one of {CROP_AREA}, got {area!r}')
    u = torch.rand(batch, 5, generator=gen)
    area = min_scale + (1 - min_scale) * u[:, 0] if area == 'uniform' else min_scale ** (1 - u[:, 0])
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
                        resample: str = 'antialiased', area: str = 'uniform') -> torch.Tensor:
    """Batched random resized crop plus horizontal flip (``random_boxes``), resampled by ``resample_boxes``.
    The boxes come from ``gen`` on the CPU, so a seed gives the same crops on every device and resampling."""
    return resample_boxes(x, random_boxes(x.shape[0], min_scale, gen, area), size, resample)


def blur_up(x: torch.Tensor, sizes: Sequence[int], share: float, gen: torch.Generator) -> torch.Tensor:
    """Each n px image of ``x``, with probability ``share``, drawn coarser and upsampled as an upsampled test
    draws it: shrunk (antialiased) to round(n * n / S) px and resized back to n px (bilinear), S drawn uniformly
    from ``sizes`` (each above n): the detail of a drawing at n px upsampled to S px, at n px. The draws come
    from ``gen`` on the CPU, so a seed gives the same images on every device."""
    n = x.shape[-1]
    if not sizes or min(sizes) <= n:
        raise ValueError(f'blur_up needs sizes above the images\' {n} px, got {list(sizes)}')
    u = torch.rand(len(x), 2, generator=gen)
    pick = (u[:, 1] * len(sizes)).long().clamp(max=len(sizes) - 1)
    out = x.clone()
    for i, size in enumerate(sizes):
        chosen = ((u[:, 0] < share) & (pick == i)).nonzero().squeeze(1).to(x.device)
        if len(chosen):
            out[chosen] = resize(resize(x[chosen], round(n * n / size)), n)
    return out


def resize(x: torch.Tensor, size: int, mode: str = 'bilinear') -> torch.Tensor:
    """Bilinear or bicubic, antialiased when shrinking (as PIL resizes ImageNet's test images)."""
    return x if x.shape[-1] == size else F.interpolate(x, size=(size, size), mode=mode, align_corners=False,
                                                       antialias=size < x.shape[-1])
