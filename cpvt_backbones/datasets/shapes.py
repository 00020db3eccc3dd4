"""A deterministic "shapes" dataset for detection and segmentation, written where mmdet and mmseg read it.

Each image has a textured background (muted smooth colour noise, faint stripes, pixel noise) and 1-3 shapes of
four classes with random size, saturated colour, rotation and position, never overlapping. Image sizes and aspect
ratios vary. Per split it writes ``<split>/images/*.jpg``, ``<split>/masks/*.png`` (label maps: 0 background,
1.. classes; what mmseg reads) and ``annotations/<split>.json`` (COCO boxes; what mmdet reads).
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ('circle', 'square', 'triangle', 'star')
FORMAT_VERSION = 3  # bump when the drawing changes, so that old data on disk is regenerated
PALETTE = ((0, 0, 0), (230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48))  # background first


@dataclass(frozen=True)
class ShapesSpec:
    num_train: int = 800
    num_val: int = 150
    min_side: int = 128
    max_side: int = 288
    max_aspect: float = 2.0
    max_objects: int = 3
    min_object: float = 0.22  # object size as a fraction of the image's shorter side
    max_object: float = 0.5
    seed: int = 0


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Muted smooth colour noise with faint stripes and pixel noise: texture, but no saturated colours."""
    grid = rng.uniform(80, 180) + rng.uniform(-35, 35, size=(rng.integers(3, 8), rng.integers(3, 8), 3))
    smooth = np.asarray(Image.fromarray(grid.clip(0, 255).astype(np.uint8)).resize((w, h), Image.BICUBIC),
                        dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    angle, period = rng.uniform(0, math.pi), rng.uniform(6, 24)
    stripes = np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period)
    smooth += stripes[..., None] * rng.uniform(4, 12) + rng.normal(0, 5, size=(h, w, 3))
    return smooth


def _saturated_colour(rng: np.random.Generator) -> np.ndarray:
    hue, sat, val = rng.uniform(0, 6), rng.uniform(0.7, 1.0), rng.uniform(0.75, 1.0) * 255
    x = val * sat * (1 - abs(hue % 2 - 1))
    c, m = val * sat, val * (1 - sat)
    rgb = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(hue)]
    return np.array(rgb) + m


def _polygon(cls: str, cx: float, cy: float, r: float, theta: float) -> List[Tuple[float, float]]:
    if cls == 'square':
        angles, radii = [theta + k * math.pi / 2 + math.pi / 4 for k in range(4)], [r] * 4
    elif cls == 'triangle':
        angles, radii = [theta + k * 2 * math.pi / 3 for k in range(3)], [r] * 3
    else:  # star
        angles = [theta + k * math.pi / 5 for k in range(10)]
        radii = [r if k % 2 == 0 else r * 0.45 for k in range(10)]
    return [(cx + a * math.cos(t), cy + a * math.sin(t)) for t, a in zip(angles, radii)]


def _draw_shape(rng: np.random.Generator, image: np.ndarray, cls_id: int, cx: float, cy: float,
                r: float) -> np.ndarray:
    """Paint one shape of class ``cls_id`` (radius ``r``) into ``image``, in a colour that stands out from what
    it covers; return its mask."""
    h, w = image.shape[:2]
    mask_img = Image.new('L', (w, h), 0)
    draw = ImageDraw.Draw(mask_img)
    if CLASSES[cls_id] == 'circle':
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=1)
    else:
        draw.polygon(_polygon(CLASSES[cls_id], cx, cy, r, rng.uniform(0, 2 * math.pi)), fill=1)
    mask = np.asarray(mask_img, dtype=bool)
    if mask.any():
        local = image[mask].mean(axis=0)
        colour = _saturated_colour(rng)
        while np.abs(colour - local).sum() < 150:
            colour = _saturated_colour(rng)
        image[mask] = colour + rng.normal(0, 3, size=(int(mask.sum()), 3))
    return mask


def _draw_image(rng: np.random.Generator, spec: ShapesSpec):
    aspect = math.exp(rng.uniform(-math.log(spec.max_aspect), math.log(spec.max_aspect)))
    h = int(rng.integers(spec.min_side, spec.max_side + 1))
    w = int(np.clip(round(h * aspect), spec.min_side, spec.max_side))
    image = _background(rng, h, w)
    labels = np.zeros((h, w), dtype=np.uint8)
    boxes: List[Tuple[int, List[float], int]] = []
    taken: List[Tuple[float, float, float, float]] = []
    for _ in range(int(rng.integers(1, spec.max_objects + 1))):
        for _attempt in range(30):
            size = rng.uniform(spec.min_object, spec.max_object) * min(h, w)
            r = size / 2
            cx, cy = rng.uniform(r + 1, w - r - 1), rng.uniform(r + 1, h - r - 1)
            box = (cx - r - 2, cy - r - 2, cx + r + 2, cy + r + 2)
            if all(box[2] < t[0] or box[0] > t[2] or box[3] < t[1] or box[1] > t[3] for t in taken):
                break
        else:
            continue
        taken.append(box)
        cls_id = int(rng.integers(len(CLASSES)))
        mask = _draw_shape(rng, image, cls_id, cx, cy, r)
        if mask.sum() < 16:
            continue
        labels[mask] = cls_id + 1
        ys, xs = np.nonzero(mask)
        x0, y0 = float(xs.min()), float(ys.min())
        boxes.append((cls_id, [x0, y0, float(xs.max()) + 1 - x0, float(ys.max()) + 1 - y0], int(mask.sum())))
    return np.clip(image, 0, 255).astype(np.uint8), labels, boxes


def generate_shapes(root, spec: ShapesSpec = ShapesSpec()) -> Dict[str, int]:
    """Write the dataset under ``root`` (idempotent for a given spec: a marker records what was written)."""
    root = Path(root)
    marker = root / 'spec.json'
    wanted = json.dumps(dict(spec.__dict__, format_version=FORMAT_VERSION), sort_keys=True)
    if marker.is_file() and marker.read_text() == wanted:
        return {'train': spec.num_train, 'val': spec.num_val}
    rng = np.random.default_rng(spec.seed)
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    for split, count in (('train', spec.num_train), ('val', spec.num_val)):
        (root / split / 'images').mkdir(parents=True, exist_ok=True)
        (root / split / 'masks').mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for idx in range(count):
            image, labels, boxes = _draw_image(rng, spec)
            name = f'{idx:05d}'
            Image.fromarray(image).save(root / split / 'images' / f'{name}.jpg', quality=92)
            Image.fromarray(labels).save(root / split / 'masks' / f'{name}.png')
            images.append(dict(id=idx, file_name=f'{name}.jpg', height=image.shape[0], width=image.shape[1]))
            for cls_id, bbox, area in boxes:
                annotations.append(dict(id=len(annotations) + 1, image_id=idx, category_id=cls_id + 1, bbox=bbox,
                                        area=area, iscrowd=0))
        coco = dict(images=images, annotations=annotations,
                    categories=[dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)])
        (root / 'annotations' / f'{split}.json').write_text(json.dumps(coco))
    marker.write_text(wanted)
    return {'train': spec.num_train, 'val': spec.num_val}


def generate_shape_crops(root, num_train: int = 4000, num_val: int = 400, size: int = 64, seed: int = 0) -> Dict[str, int]:
    """One shape per ``size`` x ``size`` image, in ``<split>/<class>/*.jpg`` folders (mmpretrain's
    CustomDataset layout): the classification set for pretraining a backbone on CPU."""
    root = Path(root)
    marker = root / 'spec.json'
    wanted = json.dumps(dict(num_train=num_train, num_val=num_val, size=size, seed=seed,
                             format_version=FORMAT_VERSION), sort_keys=True)
    if marker.is_file() and marker.read_text() == wanted:
        return {'train': num_train, 'val': num_val}
    rng = np.random.default_rng(seed)
    for split, count in (('train', num_train), ('val', num_val)):
        for name in CLASSES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        for idx in range(count):
            cls_id = idx % len(CLASSES)
            image = _background(rng, size, size)
            r = rng.uniform(0.2, 0.45) * size
            cx, cy = rng.uniform(r, size - r), rng.uniform(r, size - r)
            _draw_shape(rng, image, cls_id, cx, cy, r)
            Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
                root / split / CLASSES[cls_id] / f'{idx:05d}.jpg', quality=92)
    marker.write_text(wanted)
    return {'train': num_train, 'val': num_val}
