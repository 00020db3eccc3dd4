"""Classification scenes (``cpvt_backbones.datasets.class_scenes``) drawn natively at any size, and the apparent
object sizes of training crops and tests: what the studies of real detail (``native_detail``, ``confirm_detail``)
draw their images from and measure their scale by."""
from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np
import torch

from benchmarks.study.data import resize
from cpvt_backbones.datasets import render

MEAN, STD = 0.5, 0.25                  # fixed pixel normalisation (images scaled to 0..1)
DRAW_CHUNK = 256                       # scenes rendered at once
LEVELS = (5, 25, 50, 75, 95)           # the percentiles object sizes are reported at


def _render(scenes, scale: float) -> np.ndarray:
    return np.stack([render(scene, scale)[0] for scene in scenes])


def draw(scenes, side: int, size: int, pool: Executor | None = None) -> torch.Tensor:
    """The scenes (``side`` units square) drawn natively at ``size`` px, normalised, (N, 3, size, size):
    rendered at twice the size and shrunk (antialiased), as a camera's pixels average the scene, so that edges
    and pixel noise look alike at every size and alike in training crops and in tests. Rendered in chunks of
    ``DRAW_CHUNK`` scenes, spread over ``pool``'s processes where one is given."""
    chunks = [scenes[start:start + DRAW_CHUNK] for start in range(0, len(scenes), DRAW_CHUNK)]
    rendered = (pool.map if pool else map)(_render, chunks, [2 * size / side] * len(chunks))
    return torch.cat([resize((torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255 - MEAN) / STD,
                             size).contiguous() for images in rendered])


def crop_radii(scenes, side: int, size: int, boxes: torch.Tensor, picks: Sequence[int]) -> tuple[np.ndarray, float]:
    """The apparent radii (px) of the shapes training crops show, and the share of crops that show none: crop i is
    ``boxes[i]`` (``data.random_boxes``' layout) over the scene ``scenes[picks[i]]`` (``side`` units square),
    resized to ``size`` px; each shape whose centre lies in the box counts at the box's scale (the geometric
    mean of its two axes' px per unit)."""
    radii, empty = [], 0
    for (cx, cy, w, h, _), i in zip(boxes.tolist(), picks, strict=True):
        x0, y0 = (cx + 1 - w) / 2 * side, (cy + 1 - h) / 2 * side
        width, height = w * side, h * side
        scale = (size / width * size / height) ** 0.5
        inside = [s.r * scale for s in scenes[i].shapes if x0 <= s.cx < x0 + width and y0 <= s.cy < y0 + height]
        radii += inside
        empty += not inside
    return np.array(radii), empty / len(picks)


def percentiles(values, levels: Sequence[int] = LEVELS) -> list[float]:
    """``values`` at the percentiles ``levels``, rounded to 0.01."""
    return [round(float(v), 2) for v in np.percentile(values, levels)]


__all__ = ['DRAW_CHUNK', 'LEVELS', 'MEAN', 'STD', 'crop_radii', 'draw', 'percentiles']
