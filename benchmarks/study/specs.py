"""Typed test specifications: what a test does to the test images, and the key its result is stored under in a
run's ``result.json`` (the keys are the studies' stored format: '28', 'bicubic28', 'canvas40', 'place56@0,28').

* ``Resized(size, resample)``: the whole images resized to ``size`` px ('28'; 'bicubic28' when bicubic);
* ``OnCanvas(size)``: the images at the training size centred on a blank ``size`` px canvas ('canvas40');
* ``OnCanvasAt(canvas, top, left)``: the same at a given top-left offset ('place56@0,28');
* ``Given(size)``: images that come at ``size`` px, run as they are ('given56'; the native-detail study's
  validation windows); ``Drawn(size)``: held-out scenes drawn natively at ``size`` px ('native96');
  ``DrawnResized(size)``: the scenes' drawings at the training size resized to ``size`` px ('upsampled96').

Canvas tests put the image on a black canvas (the Fashion-MNIST background) at patch-aligned offsets, so the
object falls on the same token grid as in training.
"""
import re
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from benchmarks.study.config import TEST_RESAMPLE, StudyConfig
from benchmarks.study.data import MEAN, STD, resize


@dataclass(frozen=True)
class Resized:
    size: int
    resample: str = 'bilinear'

    @property
    def key(self) -> str:
        return f'{"" if self.resample == "bilinear" else self.resample}{self.size}'

    def render(self, x: torch.Tensor, config: StudyConfig) -> torch.Tensor:
        return resize(x, self.size, self.resample)


@dataclass(frozen=True)
class _Keyed:
    """A test of one ``size``, stored under ``PREFIX`` + size."""
    size: int
    PREFIX: ClassVar[str] = ''

    @property
    def key(self) -> str:
        return f'{self.PREFIX}{self.size}'


@dataclass(frozen=True)
class OnCanvas(_Keyed):
    PREFIX: ClassVar[str] = 'canvas'

    def render(self, x: torch.Tensor, config: StudyConfig) -> torch.Tensor:
        free = self.size - config.image_size
        offset = (free // 2) // config.patch * config.patch
        return _on_canvas(x, config, self.size, offset, offset)


@dataclass(frozen=True)
class OnCanvasAt:
    canvas: int
    top: int
    left: int

    @property
    def key(self) -> str:
        return f'place{self.canvas}@{self.top},{self.left}'

    @property
    def size(self) -> int:
        return self.canvas

    def render(self, x: torch.Tensor, config: StudyConfig) -> torch.Tensor:
        return _on_canvas(x, config, self.canvas, self.top, self.left)


@dataclass(frozen=True)
class Given(_Keyed):
    PREFIX: ClassVar[str] = 'given'

    def render(self, x: torch.Tensor, config: StudyConfig) -> torch.Tensor:
        if x.shape[-2:] != (self.size, self.size):
            raise ValueError(f'{self.key}: the images are {tuple(x.shape[-2:])}, not {self.size} x {self.size}')
        return x


@dataclass(frozen=True)
class Drawn(Given):
    PREFIX: ClassVar[str] = 'native'


@dataclass(frozen=True)
class DrawnResized(_Keyed):
    PREFIX: ClassVar[str] = 'upsampled'

    def render(self, x: torch.Tensor, config: StudyConfig) -> torch.Tensor:
        Given(config.image_size).render(x, config)
        return resize(x, self.size)


TestSpec = Resized | OnCanvas | OnCanvasAt | Given | Drawn | DrawnResized
_PREFIXED = {t.PREFIX: t for t in (OnCanvas, Given, Drawn, DrawnResized)}
_KEY = re.compile(r'place(?P<place>\d+)@(?P<top>\d+),(?P<left>\d+)|'
                  rf'(?P<prefix>{"|".join(_PREFIXED)})(?P<prefixed_size>\d+)|(?P<resample>[a-z]*)(?P<size>\d+)')


def _on_canvas(x: torch.Tensor, config: StudyConfig, size: int, top: int, left: int) -> torch.Tensor:
    free = size - config.image_size
    return F.pad(resize(x, config.image_size), (left, free - left, top, free - top), value=-MEAN / STD)


def parse_key(key: str) -> TestSpec:
    """The test a stored key names; a ValueError for a key no test writes."""
    m = _KEY.fullmatch(key)
    if m is None or m['resample'] not in (None, '', *TEST_RESAMPLE[1:]):
        raise ValueError(f'not a test key: {key!r} (e.g. 28, bicubic28, canvas40, place56@0,28, native96)')
    if m['place']:
        return OnCanvasAt(int(m['place']), int(m['top']), int(m['left']))
    if m['prefix']:
        return _PREFIXED[m['prefix']](int(m['prefixed_size']))
    return Resized(int(m['size']), m['resample'] or 'bilinear')


def size_tests(config: StudyConfig) -> list[TestSpec]:
    """The images resized to every test size (``test_resample``), then centred on every canvas size."""
    return [Resized(s, config.test_resample) for s in config.test_sizes] + \
        [OnCanvas(s) for s in config.canvas_sizes]


def placements(config: StudyConfig) -> list[OnCanvasAt]:
    """The image at 3 x 3 patch-aligned top-left offsets on the placement canvas: corners, edge middles, centre."""
    if not config.placement_canvas:
        return []
    free = config.placement_canvas - config.image_size
    steps = (0, (free // 2) // config.patch * config.patch, free)
    return [OnCanvasAt(config.placement_canvas, r, c) for r in steps for c in steps]


def study_tests(config: StudyConfig) -> list[TestSpec]:
    """Every test a study of ``config`` runs."""
    return size_tests(config) + placements(config)
