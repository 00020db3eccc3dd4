"""Padded batches computed as if each image were alone: the valid region of every image in a batch padded
bottom/right to a common size.

Given each image's valid size, a model keeps the tokens beyond it at zero before every operation that mixes
positions (patch embedding, PEG, the key/value reduction, windows), excludes them as keys, and zeroes them in
its outputs: on its valid region each image gets what it gets alone, to float32 rounding. ``region`` makes a
``ValidRegion`` for a padded batch (tensor operations only: it runs under ``torch.compile``) or a
``WholeRegion``, whose methods do nothing, for a plain one; every layer takes either and never asks which.
"""
from __future__ import annotations

import contextlib
import operator
import sys
from collections.abc import Callable, Iterator, Sequence

import torch

from .layout import symbolic_shapes


def check_valid_sizes(valid_sizes, x: torch.Tensor) -> torch.Tensor:
    """``valid_sizes`` for the (B, C, H, W) batch ``x`` as a (B, 2) int64 tensor on ``x``'s device: each image's
    (height, width) in pixels, from the top-left corner, 1 <= h <= H and 1 <= w <= W. Takes a tensor or a numpy
    array of integers, or a sequence of (h, w) pairs of integral numbers (Python or numpy integers, integer
    tensors of one element). A TypeError for anything else (floats and booleans whatever their value), a
    ValueError for a wrong shape, a size out of range or a tensor on the meta device (which holds no sizes)."""
    B, _, H, W = x.shape
    numpy = sys.modules.get('numpy')   # an array can only come from numpy where it is imported (torch needs none)
    if isinstance(valid_sizes, torch.Tensor):
        sizes = valid_sizes
        if sizes.is_floating_point() or sizes.is_complex() or sizes.dtype == torch.bool:
            raise TypeError(f'valid_sizes must hold integers (pixels), got a {sizes.dtype} tensor')
        if sizes.device.type == 'meta':
            raise ValueError(f'valid_sizes is a tensor on the meta device (shape {tuple(sizes.shape)}), which holds no '
                             'values: give the sizes as a tensor on a real device (the batch\'s, or the CPU) or as '
                             '(h, w) pairs')
    else:
        if numpy is not None and isinstance(valid_sizes, numpy.ndarray):
            if valid_sizes.dtype.kind not in 'iu':
                raise TypeError(f'valid_sizes must hold integers (pixels), got a numpy array of {valid_sizes.dtype}')
            valid_sizes = valid_sizes.tolist()
        try:
            rows = [tuple(pair) for pair in valid_sizes]
        except TypeError as e:
            raise TypeError(f'valid_sizes must be a (B, 2) tensor or a sequence of (h, w) pairs (or a (B, 2) numpy '
                            f'array), got {valid_sizes!r}') from e
        if any(len(pair) != 2 for pair in rows):
            raise ValueError(f'valid_sizes must be (h, w) pairs, got {valid_sizes!r}')
        try:
            rows = [tuple(_pixels(n) for n in pair) for pair in rows]
        except TypeError as e:
            raise TypeError(f'valid_sizes must be (h, w) pairs of ints (pixels; Python or numpy integers), got '
                            f'{valid_sizes!r}') from e
        if not symbolic_shapes() and any(not (1 <= h <= H and 1 <= w <= W) for h, w in rows):
            raise ValueError(f'valid_sizes must lie within 1..{H} (height) and 1..{W} (width) of the padded batch '
                             f'{tuple(x.shape)}; got {[list(pair) for pair in rows]}')
        sizes = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 2)
    if tuple(sizes.shape) != (B, 2):
        raise ValueError(f'valid_sizes must give (h, w) for each of the {B} images, shape ({B}, 2); got shape '
                         f'{tuple(sizes.shape)}')
    if not symbolic_shapes():   # checked where the values are: the batch itself may be on the meta device
        low, high = sizes.amin(0).tolist(), sizes.amax(0).tolist()
        if min(low) < 1 or high[0] > H or high[1] > W:
            raise ValueError(f'valid_sizes must lie within 1..{H} (height) and 1..{W} (width) of the padded batch '
                             f'{tuple(x.shape)}; got {sizes.tolist()}')
    return sizes.to(device=x.device, dtype=torch.int64)


def _pixels(n) -> int:
    """``n`` as a Python int where it is an integral number (not a boolean), else a TypeError."""
    if isinstance(n, bool) or (isinstance(n, torch.Tensor) and n.dtype == torch.bool):
        raise TypeError(f'a boolean is not a size: {n!r}')
    return operator.index(n)   # numpy's booleans and every float refuse it


def crop_to_image(m: torch.Tensor, hw: Sequence[int], stride: int) -> torch.Tensor:
    """The part of a (..., H, W) map of stride ``stride`` that an image of ``hw`` pixels at its top-left covers:
    ceil(h / stride) x ceil(w / stride), the map the image gives alone (a view)."""
    return m[..., :-(-hw[0] // stride), :-(-hw[1] // stride)]


class ValidRegion:
    """The valid region of every image on one (H, W) map: image b owns rows < ``sizes[b, 0]`` and columns <
    ``sizes[b, 1]``; ``prefix`` leading tokens (a class token) belong to every image. ``padded = True``.

    Sizes divide as the models' maps do: a map of stride s over an image of h pixels has ceil(h / s) rows
    (``region``)."""
    padded = True

    def __init__(self, sizes: torch.Tensor, hw: Sequence[int], prefix: int = 0):
        self.sizes = sizes
        self.hw = (hw[0], hw[1])
        self.prefix = prefix

    def reduced(self, ratio: int, hw: Sequence[int], floor: bool = False) -> ValidRegion:
        """The region on the ``hw`` map this one reduces to, ``ratio`` times per side: zero-padded to a multiple
        first (ceil(n / ratio) cells of each image) or, with ``floor``, the remainder dropped (max(n // ratio, 1)
        cells)."""
        cells = torch.div(self.sizes, ratio, rounding_mode='floor').clamp(min=1) if floor else \
            torch.div(self.sizes + ratio - 1, ratio, rounding_mode='floor')
        return ValidRegion(cells, hw, self.prefix)

    def map_mask(self, hw: Sequence[int] | None = None) -> torch.Tensor:
        """(B, 1, H, W) bool, True on each image's valid region (of an ``hw`` map, default this one's)."""
        h, w = self.hw if hw is None else hw
        rows = torch.arange(h, device=self.sizes.device)[None, :] < self.sizes[:, :1]
        cols = torch.arange(w, device=self.sizes.device)[None, :] < self.sizes[:, 1:]
        return (rows[:, :, None] & cols[:, None, :])[:, None]

    def token_mask(self) -> torch.Tensor:
        """(B, prefix + H * W) bool over the tokens, prefix tokens valid."""
        mask = self.map_mask().flatten(1)
        if self.prefix:
            mask = torch.cat((mask.new_ones(mask.shape[0], self.prefix), mask), dim=1)
        return mask

    def zero_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, prefix + H * W, C) tokens with those beyond each image set to zero."""
        return x.masked_fill(~self.token_mask()[..., None], 0)

    def fill_map(self, x: torch.Tensor, value: float = 0.) -> torch.Tensor:
        """A (B, C, H', W') map (H' >= H and W' >= W: the rest is padding) with everything beyond each image set
        to ``value``."""
        return x.masked_fill(~self.map_mask(x.shape[-2:]), value)

    def attention_mask(self, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The ``attn_mask`` of ``F.scaled_dot_product_attention`` for queries of these images over this map's
        tokens as keys: (B, 1, 1, prefix + H * W) bool, or the float ``bias`` with the other images' keys and
        the padding at -inf."""
        keys = self.token_mask()[:, None, None]
        return keys if bias is None else bias.masked_fill(~keys, float('-inf'))

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C) the average of each image's own tokens of the (B, prefix + N, C) ``x`` past the prefix, whose
        tokens beyond each image are zero (as a model's ``forward_features`` returns them; N need not be this
        region's H * W)."""
        return x[:, self.prefix:].sum(dim=1) / self.sizes.prod(dim=1, keepdim=True).to(x.dtype)

    def images(self) -> list[tuple[int, int]]:
        """Each image's (rows, columns) as Python ints (for per-image work outside a recorded graph); every call
        is reported to the callbacks of ``watch_per_image``."""
        if _PER_IMAGE_WATCHERS:
            caller = _calling_module()
            for callback in _PER_IMAGE_WATCHERS:
                callback(caller)
        return [tuple(pair) for pair in self.sizes.tolist()]


class WholeRegion:
    """``ValidRegion``'s counterpart for a batch without padding: each method returns its input as it is (nothing
    recorded in a graph); ``WHOLE`` is the layers' default. ``padded = False``: what a layer may ask to choose a
    whole-map algorithm. ``prefix``: leading tokens ``mean`` skips."""
    padded = False

    def __init__(self, prefix: int = 0):
        self.prefix = prefix

    def reduced(self, ratio: int, hw: Sequence[int], floor: bool = False) -> WholeRegion:
        return self

    def zero_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def fill_map(self, x: torch.Tensor, value: float = 0.) -> torch.Tensor:
        return x

    def attention_mask(self, bias: torch.Tensor | None = None) -> torch.Tensor | None:
        return bias

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.prefix:].mean(dim=1)


Region = ValidRegion | WholeRegion
WHOLE = WholeRegion()


def region(sizes: torch.Tensor | None, stride: int, hw: Sequence[int], prefix: int = 0) -> Region:
    """The region on a stride-``stride`` map of size ``hw`` of images ``sizes`` pixels large ((B, 2), from
    ``check_valid_sizes``): a ``ValidRegion``, or a ``WholeRegion`` for ``sizes=None`` (no padding)."""
    if sizes is None:   # the one place that tells a padded batch from a plain one
        return WholeRegion(prefix)
    return ValidRegion(torch.div(sizes + stride - 1, stride, rounding_mode='floor'), hw, prefix)


# What ``watch_per_image`` calls at each ``ValidRegion.images``.
_PER_IMAGE_WATCHERS: list[Callable[[torch.nn.Module | None], None]] = []


def _calling_module() -> torch.nn.Module | None:
    """The innermost module whose method (``self``) is on the stack above ``ValidRegion.images``, or None."""
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get('self')
        if isinstance(owner, torch.nn.Module):
            return owner
        frame = frame.f_back
    return None


@contextlib.contextmanager
def watch_per_image(callback: Callable[[torch.nn.Module | None], None]) -> Iterator[None]:
    """Call ``callback`` at every ``ValidRegion.images`` while the ``with`` block runs, with the innermost module
    whose method called it (None where no module's did): where a model's valid-size path works image by image in
    Python, which ``torch.export`` cannot record."""
    _PER_IMAGE_WATCHERS.append(callback)
    try:
        yield
    finally:
        _PER_IMAGE_WATCHERS.remove(callback)


__all__ = ['WHOLE', 'Region', 'ValidRegion', 'WholeRegion', 'check_valid_sizes', 'crop_to_image', 'region',
           'watch_per_image']
