"""A deterministic "shapes" dataset for detection and segmentation, written where mmdet and mmseg read it.

Each image has a textured background (muted smooth colour noise, faint stripes, pixel noise) and 1-3 shapes of
four classes with random size, saturated colour, rotation and position, never overlapping. Image sizes and aspect
ratios vary. An image is sampled as a resolution-free ``Scene`` and drawn by ``render(scene, scale)``, so the
same scenes can be drawn natively at any size (``generate_drawn_split``). Per split it writes
``<split>/images/*.jpg``, ``<split>/masks/*.png`` (label maps: 0 background, 1.. classes; what mmseg reads) and
``annotations/<split>.json`` (COCO boxes and instance masks as uncompressed RLE; what mmdet reads).
"""
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ('circle', 'square', 'triangle', 'star')
FORMAT_VERSION = 5  # bump when what is written changes, so that old data on disk is regenerated


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


@dataclass(frozen=True)
class Shape:
    cls_id: int
    cx: float      # centre and radius in pixels of the scene at scale 1
    cy: float
    r: float
    theta: float
    colour: tuple[float, float, float]


@dataclass(frozen=True)
class Scene:
    """One image as a resolution-free description: ``render(scene, scale)`` draws it at any size, with crisp
    edges and texture at that resolution (no resampled pixels). ``seed`` seeds the pixel noise."""
    height: int
    width: int
    grid: np.ndarray                  # background colour grid, bicubically stretched over the image
    stripes: tuple[float, float, float]  # angle, period (px at scale 1), amplitude
    shapes: tuple[Shape, ...]
    seed: int


def _background(scene: Scene, h: int, w: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Muted smooth colour noise with faint stripes and pixel noise: texture, but no saturated colours."""
    smooth = np.asarray(Image.fromarray(scene.grid.clip(0, 255).astype(np.uint8)).resize((w, h), Image.BICUBIC),
                        dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    angle, period, amplitude = scene.stripes
    stripes = np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / (period * scale))
    return smooth + stripes[..., None] * amplitude + rng.normal(0, 5, size=(h, w, 3))


def _saturated_colour(rng: np.random.Generator) -> np.ndarray:
    hue, sat, val = rng.uniform(0, 6), rng.uniform(0.7, 1.0), rng.uniform(0.75, 1.0) * 255
    x = val * sat * (1 - abs(hue % 2 - 1))
    c, m = val * sat, val * (1 - sat)
    rgb = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(hue)]
    return np.array(rgb) + m


def _contrasting(rng: np.random.Generator, shape: Shape, background: np.ndarray) -> Shape:
    """``shape`` in a saturated colour that stands out from the background it covers at scale 1."""
    mask = _mask(shape, background.shape[0], background.shape[1], 1.)
    local = background[mask].mean(axis=0) if mask.any() else np.zeros(3)
    colour = _saturated_colour(rng)
    while np.abs(colour - local).sum() < 150:
        colour = _saturated_colour(rng)
    return replace(shape, colour=tuple(float(c) for c in colour))


def _sample_background(rng: np.random.Generator, h: int, w: int) -> Scene:
    grid = rng.uniform(80, 180) + rng.uniform(-35, 35, size=(rng.integers(3, 8), rng.integers(3, 8), 3))
    stripes = (rng.uniform(0, math.pi), rng.uniform(6, 24), rng.uniform(4, 12))
    return Scene(h, w, grid, stripes, (), int(rng.integers(2 ** 31)))


def _polygon(cls: str, cx: float, cy: float, r: float, theta: float) -> list[tuple[float, float]]:
    if cls == 'square':
        angles, radii = [theta + k * math.pi / 2 + math.pi / 4 for k in range(4)], [r] * 4
    elif cls == 'triangle':
        angles, radii = [theta + k * 2 * math.pi / 3 for k in range(3)], [r] * 3
    else:  # star
        angles = [theta + k * math.pi / 5 for k in range(10)]
        radii = [r if k % 2 == 0 else r * 0.45 for k in range(10)]
    return [(cx + a * math.cos(t), cy + a * math.sin(t)) for t, a in zip(angles, radii, strict=False)]


def _mask(shape: Shape, h: int, w: int, scale: float) -> np.ndarray:
    """The shape rasterised at ``scale`` (PIL's polygon fill: hard edges at every resolution)."""
    mask_img = Image.new('L', (w, h), 0)
    draw = ImageDraw.Draw(mask_img)
    cx, cy, r = shape.cx * scale, shape.cy * scale, shape.r * scale
    if CLASSES[shape.cls_id] == 'circle':
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=1)
    else:
        draw.polygon(_polygon(CLASSES[shape.cls_id], cx, cy, r, shape.theta), fill=1)
    return np.asarray(mask_img, dtype=bool)


def rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed run-length encoding of a boolean (H, W) mask: ``{'size': [H, W], 'counts': [...]}``,
    alternating runs of 0s and 1s in column-major order, starting with 0s (pycocotools' ``frPyObjects`` reads
    it; mmdet's ``LoadAnnotations`` and ``CocoMetric`` take it as an instance's ``segmentation``)."""
    flat = np.asarray(mask, dtype=bool).ravel(order='F')
    edges = np.flatnonzero(np.diff(flat.astype(np.int8))) + 1
    runs = np.diff(np.concatenate(([0], edges, [flat.size])))
    counts = ([0] if flat.size and flat[0] else []) + runs.tolist()
    return dict(size=[int(mask.shape[0]), int(mask.shape[1])], counts=[int(c) for c in counts])


def render(scene: Scene, scale: float = 1.):
    """The scene drawn at ``scale`` (image round(height * scale) x round(width * scale)): the uint8 RGB image, the
    label map (0 background, 1.. classes) and per shape with >= 16 pixels its class, COCO box ``[x, y, w, h]``,
    area and mask ``(class, box, area, mask)`` (the shapes never overlap, so each mask is the shape's pixels)."""
    h, w = max(1, round(scene.height * scale)), max(1, round(scene.width * scale))
    rng = np.random.default_rng(scene.seed)
    image = _background(scene, h, w, scale, rng)
    labels = np.zeros((h, w), dtype=np.uint8)
    boxes: list[tuple[int, list[float], int, np.ndarray]] = []
    min_pixels = 16 * scale * scale
    for shape in scene.shapes:
        mask = _mask(shape, h, w, scale)
        image[mask] = np.asarray(shape.colour) + rng.normal(0, 3, size=(int(mask.sum()), 3))
        if mask.sum() < max(min_pixels, 1):
            continue
        labels[mask] = shape.cls_id + 1
        ys, xs = np.nonzero(mask)
        x0, y0 = float(xs.min()), float(ys.min())
        boxes.append((shape.cls_id, [x0, y0, float(xs.max()) + 1 - x0, float(ys.max()) + 1 - y0], int(mask.sum()),
                      mask))
    return np.clip(image, 0, 255).astype(np.uint8), labels, boxes


def _place_shapes(rng: np.random.Generator, base: Scene, count: int, min_object: float, max_object: float,
                  cls_id: int | None = None) -> Scene:
    """``base`` with up to ``count`` non-overlapping shapes (radius ``min_object``..``max_object`` of half the
    shorter side; a shape that finds no free place in 30 tries is left out), each in a colour that stands out from
    the background it covers (judged at scale 1), of class ``cls_id`` or each of a random class."""
    h, w = base.height, base.width
    background = _background(base, h, w, 1., np.random.default_rng(base.seed))
    shapes: list[Shape] = []
    taken: list[tuple[float, float, float, float]] = []
    for _ in range(count):
        for _attempt in range(30):
            r = rng.uniform(min_object, max_object) * min(h, w) / 2
            cx, cy = rng.uniform(r + 1, w - r - 1), rng.uniform(r + 1, h - r - 1)
            box = (cx - r - 2, cy - r - 2, cx + r + 2, cy + r + 2)
            if all(box[2] < t[0] or box[0] > t[2] or box[3] < t[1] or box[1] > t[3] for t in taken):
                break
        else:
            continue
        taken.append(box)
        cls = int(rng.integers(len(CLASSES))) if cls_id is None else cls_id
        shapes.append(_contrasting(rng, Shape(cls, cx, cy, r, float(rng.uniform(0, 2 * math.pi)), (0., 0., 0.)),
                                   background))
    return replace(base, shapes=tuple(shapes))


def _scene(rng: np.random.Generator, spec: ShapesSpec) -> Scene:
    """Sample one scene: size, background, and 1..max_objects non-overlapping shapes of random classes."""
    aspect = math.exp(rng.uniform(-math.log(spec.max_aspect), math.log(spec.max_aspect)))
    h = int(rng.integers(spec.min_side, spec.max_side + 1))
    w = int(np.clip(round(h * aspect), spec.min_side, spec.max_side))
    return _place_shapes(rng, _sample_background(rng, h, w), int(rng.integers(1, spec.max_objects + 1)),
                         spec.min_object, spec.max_object)


def class_scenes(count: int, side: int, seed: int, objects: tuple[int, int] = (2, 4),
                 object_size: tuple[float, float] = (0.16, 0.36)) -> tuple[list[Scene], np.ndarray]:
    """A classification set: ``count`` square scenes ``side`` px wide at scale 1, each with
    ``objects[0]..objects[1]`` non-overlapping shapes of one class (radius ``object_size`` of half the side) at
    random positions, sizes and rotations on the textured background, and the class index of each scene
    (deterministic for given arguments). ``render(scene, size / side)`` draws one natively at ``size`` px."""
    if not 1 <= objects[0] <= objects[1] or not 0 < object_size[0] <= object_size[1] < 1:
        raise ValueError(f'need 1 <= objects[0] <= objects[1] and 0 < object_size[0] <= object_size[1] < 1, got '
                         f'objects={objects}, object_size={object_size}')
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % len(CLASSES)
    rng.shuffle(labels)
    scenes = [_place_shapes(rng, _sample_background(rng, side, side), int(rng.integers(objects[0], objects[1] + 1)),
                            *object_size, cls_id=int(cls)) for cls in labels]
    return scenes, labels


def shape_scenes(spec: ShapesSpec = ShapesSpec()) -> dict[str, list[Scene]]:
    """The scenes of both splits (deterministic for a given spec)."""
    rng = np.random.default_rng(spec.seed)
    return {split: [_scene(rng, spec) for _ in range(count)]
            for split, count in (('train', spec.num_train), ('val', spec.num_val))}


def write_split(root, split: str, scenes: Sequence[Scene], scale=lambda scene: 1.) -> None:
    """Render ``scenes`` (each at ``scale(scene)``) as ``<root>/<split>/{images,masks}`` and
    ``<root>/annotations/<split>.json``."""
    root = Path(root)
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    (root / split / 'images').mkdir(parents=True, exist_ok=True)
    (root / split / 'masks').mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for idx, scene in enumerate(scenes):
        image, labels, boxes = render(scene, scale(scene))
        name = f'{idx:05d}'
        Image.fromarray(image).save(root / split / 'images' / f'{name}.jpg', quality=92)
        Image.fromarray(labels).save(root / split / 'masks' / f'{name}.png')
        images.append(dict(id=idx, file_name=f'{name}.jpg', height=image.shape[0], width=image.shape[1]))
        for cls_id, bbox, area, mask in boxes:
            annotations.append(dict(id=len(annotations) + 1, image_id=idx, category_id=cls_id + 1, bbox=bbox,
                                    area=area, segmentation=rle(mask), iscrowd=0))
    coco = dict(images=images, annotations=annotations,
                categories=[dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)])
    (root / 'annotations' / f'{split}.json').write_text(json.dumps(coco))


def _written(root: Path, wanted: str) -> bool:
    marker = root / 'spec.json'
    return marker.is_file() and marker.read_text() == wanted


def _generate_once(root, wanted: str, write: Callable[[Path], None]) -> Path:
    """``write`` a dataset into a temporary folder beside ``root``, then rename it to ``root``: a reader sees the
    whole dataset or none, and of processes generating the same data at once (the shards of a study) the first
    rename wins and the others keep it. ``spec.json`` (``wanted``) marks what a folder holds; a folder with
    another mark is replaced."""
    root = Path(root)
    if _written(root, wanted):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{root.name}.', dir=root.parent))
    try:
        write(tmp)
        (tmp / 'spec.json').write_text(wanted)
        try:
            os.rename(tmp, root)
        except OSError:  # root exists: another process's copy of the same data, or stale data
            if not _written(root, wanted):
                shutil.rmtree(root)
                os.rename(tmp, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return root


def generate_shapes(root, spec: ShapesSpec = ShapesSpec()) -> dict[str, int]:
    """Write the dataset under ``root`` (idempotent for a given spec: a marker records what was written)."""
    def write(folder: Path) -> None:
        for split, scenes in shape_scenes(spec).items():
            write_split(folder, split, scenes)
    _generate_once(root, json.dumps(dict(spec.__dict__, format_version=FORMAT_VERSION), sort_keys=True), write)
    return {'train': spec.num_train, 'val': spec.num_val}


def generate_drawn_split(root, spec: ShapesSpec, long_side: int, split: str = 'val') -> Path:
    """The scenes of ``split`` drawn natively with their long side ``long_side`` px (each at its own scale), in
    the same layout under ``root``. Idempotent like ``generate_shapes``; returns ``root``."""
    wanted = json.dumps(dict(spec.__dict__, format_version=FORMAT_VERSION, long_side=long_side, split=split),
                        sort_keys=True)
    return _generate_once(root, wanted, lambda folder: write_split(
        folder, split, shape_scenes(spec)[split], lambda scene: long_side / max(scene.height, scene.width)))


def generate_shape_crops(root, num_train: int = 4000, num_val: int = 400, size: int = 64,
                         seed: int = 0) -> dict[str, int]:
    """One shape per ``size`` x ``size`` image, in ``<split>/<class>/*.jpg`` folders (mmpretrain's
    CustomDataset layout): the classification set for pretraining a backbone on CPU."""
    wanted = json.dumps(dict(num_train=num_train, num_val=num_val, size=size, seed=seed,
                             format_version=FORMAT_VERSION), sort_keys=True)
    _generate_once(root, wanted, lambda folder: _write_crops(folder, num_train, num_val, size, seed))
    return {'train': num_train, 'val': num_val}


def _write_crops(root: Path, num_train: int, num_val: int, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for split, count in (('train', num_train), ('val', num_val)):
        for name in CLASSES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        for idx in range(count):
            cls_id = idx % len(CLASSES)
            base = _sample_background(rng, size, size)
            r = rng.uniform(0.2, 0.45) * size
            shape = Shape(cls_id, rng.uniform(r, size - r), rng.uniform(r, size - r), r,
                          float(rng.uniform(0, 2 * math.pi)), (0., 0., 0.))
            background = _background(base, size, size, 1., np.random.default_rng(base.seed))
            image, _, _ = render(replace(base, shapes=(_contrasting(rng, shape, background),)))
            Image.fromarray(image).save(root / split / CLASSES[cls_id] / f'{idx:05d}.jpg', quality=92)
