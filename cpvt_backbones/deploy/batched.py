"""``run_images``: a model over many images of different sizes in padded batches, each image's output the one it
gets alone; the batching helpers it uses.
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


def _channels(n: int) -> str:
    return f'{n} channel' + ('' if n == 1 else 's')


def check_images(images: Sequence[torch.Tensor], in_chans: int | None = None) -> None:
    """Raise a ``ValueError`` naming the first image (``images[i]``) that cannot share a batch with the others as
    it is: not a (C, h, w) tensor with pixels, not floating point (convert and normalise it first), channels
    other than ``in_chans`` (where given) or than the first image's, a dtype or device other than the first
    image's."""
    first = None
    for i, image in enumerate(images):
        if not isinstance(image, torch.Tensor) or image.dim() != 3 or 0 in image.shape:
            raise ValueError(f'images[{i}] must be a (C, h, w) tensor with pixels, got '
                             f'{tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__}')
        if not image.is_floating_point():
            raise ValueError(f'images[{i}] is {image.dtype}: the model takes floating-point images, convert and '
                             'normalise it first')
        if in_chans is not None and image.shape[0] != in_chans:
            raise ValueError(f'images[{i}] has {_channels(image.shape[0])}, the model takes {in_chans} (in_chans)')
        if first is None:
            first = image
            continue
        if image.shape[0] != first.shape[0]:
            raise ValueError(f'images[{i}] has {_channels(image.shape[0])}, images[0] has {first.shape[0]}: every '
                             'image must have the same channels')
        if image.dtype != first.dtype:
            raise ValueError(f'images[{i}] is {image.dtype}, images[0] is {first.dtype}: every image must have the '
                             'same dtype (convert them to one first)')
        if image.device != first.device:
            raise ValueError(f'images[{i}] is on {image.device}, images[0] on {first.device}: every image must be '
                             'on the same device')


def pad_images(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, h, w) images as one zero-padded (B, C, H, W) batch (each image top-left) and their (B, 2) sizes; the
    images must have one channel count, floating dtype and device (``check_images``), which the batch has."""
    check_images(images)
    sizes = torch.tensor([tuple(image.shape[-2:]) for image in images], dtype=torch.int64)
    H, W = sizes.amax(0).tolist()
    batch = images[0].new_zeros(len(images), images[0].shape[0], H, W)
    for b, image in enumerate(images):
        batch[b, :, :image.shape[-2], :image.shape[-1]] = image
    return batch, sizes


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` in storage of its own size: a copy where ``t`` is a view into a larger tensor (a batch's output)."""
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.is_contiguous() else t.clone()


def _crop(output, b: int, h: int, w: int, strides: Sequence[int]):
    """Image ``b``'s part of a batch ``output``: a tensor's row, or of a sequence of feature maps each map cropped
    to the image at its stride; each in storage of its own (``_compact``)."""
    if isinstance(output, torch.Tensor):
        return _compact(output[b])
    if len(output) != len(strides):
        raise ValueError(f'the model returned {len(output)} maps but has {len(strides)} strides (model.strides)')
    return type(output)(_compact(crop_to_image(m[b], (h, w), s)) for m, s in zip(output, strides, strict=True))


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
    a tuple of maps for a feature model), to float32 rounding, in the order of ``images``, each in storage of its
    own. Images are batched by size and padded with the valid sizes where the model takes them
    (``takes_valid_sizes``), else batched only with images of their own size; a feature map of stride s is
    cropped to ceil(h / s) x ceil(w / s). Images are never converted. Every image must have the same
    channels (the model's ``in_chans`` where it has that attribute), one floating dtype and one device, else a
    ``ValueError`` names the first that differs and how (``check_images``), before the model runs.
    ``progress``: True reports on stderr every ``PROGRESS_EVERY`` seconds on a long run (images done, rate, time
    left), or a callable gets those lines."""
    if model.training:
        raise ValueError('run_images runs a model in evaluation mode: call model.eval() first')
    in_chans = getattr(model, 'in_chans', None)
    check_images(images, in_chans if isinstance(in_chans, int) else None)
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


__all__ = ['PROGRESS_EVERY', 'Progress', 'check_images', 'pad_images', 'run_images', 'size_batches',
           'takes_valid_sizes']
