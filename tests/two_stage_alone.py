"""A two-stage detector's predictions in a padded batch against each image's predictions alone: the shapes scenes
the comparison runs on, and a measurement over many of them (docs/reliability.md, "Two-stage detectors").

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python tests/two_stage_alone.py --images 96 [--checkpoint W.pth]

prints, for Mask R-CNN's shapes config (random weights, seed 0, unless a checkpoint is given), the largest score
and box differences of matched detections, the mask pixels that differ as a share of the masks' area, and how far
from the 0.5 threshold the alone run's probability is at each differing pixel (read from mmdet's mask pasting).
"""
import argparse
import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MASK_RCNN = 'mask-rcnn_pcpvt-tiny_fpn_shapes.py'
# What docs/reliability.md states of a two-stage detection in a padded batch against the image alone: its score and
# its box (px).
TWO_STAGE = dict(score=1e-4, box=1e-2)


def pairing(a, b, score: float, box: float) -> torch.Tensor | None:
    """``order`` with ``b[order[i]]`` the same detection as ``a[i]`` (same label, score within ``score``, box
    within ``box`` px), one for one and in the same order but where two of ``b``'s scores lie within ``score``
    of each other (a tie to float32 rounding, which sorts either way); None where there is none such."""
    if len(a) != len(b):
        return None
    order, free = [], torch.ones(len(b), dtype=torch.bool)
    for i in range(len(a)):
        fits = free & (b.labels == a.labels[i]) & ((b.scores - a.scores[i]).abs() < score) \
            & ((b.bboxes - a.bboxes[i]).abs().amax(dim=1) < box)
        if not fits.any():
            return None
        j = int(fits.nonzero()[0])
        if (b.scores[j] - b.scores[i]).abs() >= score:
            return None
        order.append(j)
        free[j] = False
    return torch.tensor(order, dtype=torch.int64)


def scenes(count: int, long_side: int = 192, seed: int = 5) -> list[torch.Tensor]:
    """``count`` shapes scenes drawn with their long side ``long_side`` px (the detectors' training scale), as
    (3, h, w) uint8 tensors: images of many sizes with objects a trained detector finds."""
    from cpvt_backbones.datasets import ShapesSpec, render, shape_scenes
    out = []
    for scene in shape_scenes(ShapesSpec(num_train=0, num_val=count, seed=seed))['val']:
        image, _, _ = render(scene, long_side / max(scene.height, scene.width))
        out.append(torch.from_numpy(image).permute(2, 0, 1).contiguous())
    return out


def batch_of(scope: str, images: list[torch.Tensor]) -> dict:
    """A test dataloader's batch of ``images`` with their data samples (no resize: each at its own size)."""
    import importlib
    structures = importlib.import_module(f'{scope}.structures')
    sample = structures.DetDataSample if scope == 'mmdet' else structures.SegDataSample
    return dict(inputs=list(images),
                data_samples=[sample(metainfo=dict(img_shape=tuple(i.shape[1:]), ori_shape=tuple(i.shape[1:]),
                                                   scale_factor=(1., 1.))) for i in images])


def predictions(model, batch: dict) -> list:
    with torch.no_grad():
        return model.test_step(copy.deepcopy(batch))


class SoftMasks:
    """While the ``with`` block runs, mmdet's mask pasting also records each instance's pasted probabilities
    (before the threshold), one (H, W) float map per instance of each image predicted, in order."""

    def __enter__(self):
        from mmdet.models.roi_heads.mask_heads import fcn_mask_head
        self.module, self.original, self.maps = fcn_mask_head, fcn_mask_head._do_paste_mask, []

        def paste(masks, boxes, img_h, img_w, skip_empty=True):
            chunk, spatial = self.original(masks, boxes, img_h, img_w, skip_empty)
            for k in range(chunk.shape[0]):
                full = torch.zeros(int(img_h), int(img_w))
                full[spatial] = chunk[k]
                self.maps.append(full)
            return chunk, spatial
        fcn_mask_head._do_paste_mask = paste
        return self

    def __exit__(self, *exc):
        self.module._do_paste_mask = self.original


def measure(model, images: list[torch.Tensor], batch_size: int) -> dict:
    """Each image predicted in padded batches of ``batch_size`` and alone; over the matched detections (paired
    within ``TWO_STAGE`` by ``pairing``; ``swapped`` counts the images where a near tie came in the other order):
    the largest score and box differences, the differing mask pixels (count, share of the union of the two masks'
    area, images with any), and the largest distance of the alone probability from the threshold at a differing
    pixel."""
    threshold = model.roi_head.test_cfg.mask_thr_binary
    worst = dict(images=len(images), detections=0, score=0., box=0., pixels=0, area=0, images_with_pixels=0,
                 largest_share=0., farthest=0., mismatched=0, swapped=0)
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        batched = predictions(model, batch_of('mmdet', chunk))
        for b, image in enumerate(chunk):
            with SoftMasks() as soft:
                (alone,) = predictions(model, batch_of('mmdet', [image]))
            got, want = batched[b].pred_instances, alone.pred_instances
            order = pairing(got, want, **TWO_STAGE)
            if order is None:
                worst['mismatched'] += 1
                continue
            want = want[order]
            soft.maps = [soft.maps[j] for j in order.tolist()]
            worst['swapped'] += not torch.equal(order, torch.arange(len(order)))
            worst['detections'] += len(want)
            if not len(want):
                continue
            worst['score'] = max(worst['score'], (got.scores - want.scores).abs().max().item())
            worst['box'] = max(worst['box'], (got.bboxes - want.bboxes).abs().max().item())
            differ = got.masks != want.masks
            pixels, area = int(differ.sum()), int((got.masks | want.masks).sum())
            worst['pixels'] += pixels
            worst['area'] += area
            worst['images_with_pixels'] += pixels > 0
            worst['largest_share'] = max(worst['largest_share'], pixels / max(area, 1))
            if pixels:
                probs = torch.stack(soft.maps)
                worst['farthest'] = max(worst['farthest'], (probs[differ] - threshold).abs().max().item())
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--images', type=int, default=96)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--checkpoint', help='trained weights (an mmengine checkpoint of the config)')
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / 'tests'))
    from shapes_models import shapes_model
    model = shapes_model(MASK_RCNN)
    if args.checkpoint:
        import cpvt_backbones.adapters.checkpoint  # noqa: F401  (mmengine's log buffers load safely)
        from cpvt_backbones.convert import safe_load
        model.load_state_dict(safe_load(args.checkpoint)['state_dict'])
    from cpvt_backbones.utils import cpu_info
    result = measure(model, scenes(args.images), args.batch_size)
    share = result['pixels'] / max(result['area'], 1)
    weights = f'weights {args.checkpoint}' if args.checkpoint else 'random weights'
    print(f"{cpu_info()['cpu']} ({cpu_info()['isa']}), torch {torch.__version__}, {torch.get_num_threads()} "
          f"thread(s); {weights}")
    print(f"{result['images']} images in batches of {args.batch_size}, {result['detections']} detections "
          f"({result['mismatched']} images with other detections, {result['swapped']} with a near tie in the other "
          f"order): scores within {result['score']:.2e}, boxes within "
          f"{result['box']:.2e} px; {result['pixels']} mask pixels differ in {result['images_with_pixels']} images, "
          f"{share:.2e} of the masks' area (largest on one image {result['largest_share']:.2e}); each where the "
          f"alone probability is within {result['farthest']:.2e} of the threshold")


if __name__ == '__main__':
    main()
