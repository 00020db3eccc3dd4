"""``run_images``: a model over many images of different sizes in padded batches, each image's output the one it
gets alone.

Images are grouped by size (sorted by height, then width, so that a batch pads little), each batch is padded
bottom/right to its largest image, and the model runs it with each image's valid size (``layers.valid``): the
models here and the fused engine compute every image exactly as alone. A module that takes no ``valid_sizes``
(an OpenVINO or onnxruntime module, a classifier of another library) runs batches of images of one size only,
which need no padding. Outputs are cropped to each image (a feature map of stride s to ceil(h / s) x ceil(w / s))
and returned in the order of the images.
"""
import inspect
import sys
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..layers.valid import crop_to_image

# How often a long run reports its progress, in seconds.
PROGRESS_EVERY = 10.


def takes_valid_sizes(module: nn.Module) -> bool:
    """Whether ``module``'s forward takes ``valid_sizes`` (computes a padded batch as if each image were alone)."""
    try:
        return 'valid_sizes' in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def size_batches(sizes: Sequence[tuple[int, int]], batch_size: int, pad: bool = True) -> list[list[int]]:
    """The indices of ``sizes`` in batches of at most ``batch_size``, sorted by height and width so that the
    images of a batch are of similar size; with ``pad=False`` every batch holds images of one size."""
    if batch_size < 1:
        raise ValueError(f'batch_size must be at least 1, got {batch_size}')
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i][0], sizes[i][1], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < batch_size and (pad or sizes[batches[-1][0]] == sizes[i]):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad_images(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, h, w) images as one zero-padded (B, C, H, W) batch (each image top-left) and their (B, 2) sizes."""
    sizes = torch.tensor([tuple(image.shape[-2:]) for image in images], dtype=torch.int64)
    H, W = sizes.amax(0).tolist()
    batch = images[0].new_zeros(len(images), images[0].shape[0], H, W)
    for b, image in enumerate(images):
        batch[b, :, :image.shape[-2], :image.shape[-1]] = image
    return batch, sizes


def _crop(output, b: int, h: int, w: int, strides: Sequence[int]):
    """Image ``b``'s part of a batch ``output``: a tensor's row, or of a sequence of feature maps each map cropped
    to the image at its stride."""
    if isinstance(output, torch.Tensor):
        return output[b]
    if len(output) != len(strides):
        raise ValueError(f'the model returned {len(output)} maps but has {len(strides)} strides (model.strides)')
    return type(output)(crop_to_image(m[b], (h, w), s) for m, s in zip(output, strides, strict=True))


class Progress:
    """Reports ``done`` of ``total`` images with the rate, at most every ``PROGRESS_EVERY`` seconds and at the
    end of a run that reported anything."""

    def __init__(self, total: int, report: Callable[[str], None] | None):
        self.total, self.report, self.start = total, report, time.perf_counter()
        self.last, self.said = self.start, False

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if self.report is None or (now - self.last < PROGRESS_EVERY and not (done == self.total and self.said)):
            return
        rate = done / max(now - self.start, 1e-9)
        left = (self.total - done) / rate if rate else float('inf')
        self.report(f'{done}/{self.total} images, {rate:.1f} images/s' + (f', about {left:.0f} s left'
                                                                          if done < self.total else ''))
        self.last, self.said = now, True


def _stderr(line: str) -> None:
    print(f'[run_images] {line}', file=sys.stderr, flush=True)


def run_images(model: nn.Module, images: Sequence[torch.Tensor], batch_size: int = 8,
               progress: bool | Callable[[str], None] = False) -> list:
    """``model`` (evaluation mode) on each of ``images`` ((C, h, w) tensors of any sizes), batched: each
    returned output is what ``model(image[None])`` returns for that image (its row: a tensor for a classifier,
    a tuple of maps for a feature model), to float32 rounding, in the order of ``images``. Images are batched by
    size and padded with the valid sizes where the model takes them (``takes_valid_sizes``), else batched only
    with images of their own size. ``progress``: True reports on stderr every ``PROGRESS_EVERY`` seconds on a
    long run (images done, rate, time left), or a callable gets those lines."""
    if model.training:
        raise ValueError('run_images runs a model in evaluation mode: call model.eval() first')
    for i, image in enumerate(images):
        if not isinstance(image, torch.Tensor) or image.dim() != 3 or 0 in image.shape:
            raise ValueError(f'images[{i}] must be a (C, h, w) tensor with pixels, got '
                             f'{tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__}')
    padded = takes_valid_sizes(model)
    strides = tuple(getattr(model, 'strides', ()) or ())
    sizes = [tuple(image.shape[-2:]) for image in images]
    report = Progress(len(images), _stderr if progress is True else progress or None)
    outputs: list = [None] * len(images)
    done = 0
    with torch.no_grad():
        for batch in size_batches(sizes, batch_size, pad=padded):
            x, valid = pad_images([images[i] for i in batch])
            same = all(sizes[i] == sizes[batch[0]] for i in batch)
            out = model(x) if same else model(x, valid_sizes=valid)
            for b, i in enumerate(batch):
                outputs[i] = _crop(out, b, *sizes[i], strides)
            done += len(batch)
            report(done)
    return outputs


__all__ = ['PROGRESS_EVERY', 'Progress', 'pad_images', 'run_images', 'size_batches', 'takes_valid_sizes']
