"""The study's design as its protocol gives it: the training configuration (``study_config``), the scene sets
drawn (``load_data``), the tests (``tests``), the object sizes crops and tests show (``object_scales``), and one
run trained and checked at every epoch (``run``)."""
import time
from concurrent.futures import Executor

import numpy as np
import torch

from benchmarks.confirm_detail.protocol import ROOT, TAG, TASK_FIELDS, Protocol, check_may_run
from benchmarks.study import records
from benchmarks.study.config import StudyConfig
from benchmarks.study.data import random_boxes
from benchmarks.study.scenes import LEVELS, crop_radii, draw, percentiles
from benchmarks.study.specs import Drawn, DrawnResized, Given
from benchmarks.study.trainer import fp32_precision, train
from cpvt_backbones.datasets import class_scenes


def study_config(protocol: Protocol, pilot: bool, candidate: str | None = None, **fields) -> StudyConfig:
    """The ``StudyConfig`` of the confirmatory grid, or with ``pilot`` of the pilot candidate ``candidate`` (its
    runs under PILOT_NAME/CANDIDATE); ``fields``: device, tf32, shard, folders."""
    d, recipe = protocol.data, protocol.recipe(candidate)
    arms, seeds = (d['pilot']['arms'], d['pilot']['seeds']) if pilot else (d['arms'], d['seeds'])
    name = d['pilot']['name'] if pilot else d['name']
    return StudyConfig().replace(
        name=name, runs=f'{name}/{candidate}' if pilot else None, variants=tuple(arms), seeds=tuple(seeds),
        train_images=d['data']['train_fields'], test_images=d['data']['test_images'], image_size=protocol.train_size,
        test_sizes=protocol.sizes, probe_images=0, in_chans=3, num_classes=4, head='gap', stem=True,
        crop_scale=d['crops']['min_area'], crop_area=d['crops']['area'], crop_resample=d['crops']['resample'],
        blur_up=d['blur_up']['share'], warmup=recipe['warmup_epochs'] / recipe['epochs'],
        **{k: v for k, v in recipe.items() if k not in TASK_FIELDS}, **fields)


def field_scenes(protocol: Protocol, candidate: str | None = None):
    """The training fields and their labels: scene set ``train``, ``data.field_side`` units square, with
    ``data.field_objects`` objects of the test scenes' radii in units (about the test scenes' density; radii as
    ``Protocol.object_size`` gives them for ``candidate``)."""
    d = protocol['data']
    size = tuple(round(s * d['test_side'] / d['field_side'], 4) for s in protocol.object_size(candidate))
    return class_scenes(d['train_fields'], d['field_side'], d['scene_sets']['train'], tuple(d['field_objects']),
                        size)


def held_out_scenes(protocol: Protocol, which: str, count: int, candidate: str | None = None):
    """``count`` scenes of the scene set ``which`` ('validation', 'test', 'pilot_test') and their labels, the
    shapes' radii as ``Protocol.object_size`` gives them for ``candidate``."""
    d = protocol['data']
    return class_scenes(count, d['test_side'], d['scene_sets'][which], tuple(d['objects']),
                        protocol.object_size(candidate))


def load_data(protocol: Protocol, pilot: bool, pool: Executor | None = None, candidate: str | None = None):
    """(training fields at ``data.field_px`` and labels, validation at the training size and labels, {test size:
    (the test set drawn at that size, labels)}), the objects sized for ``candidate``; the pilot's tests are the
    pilot test set's."""
    d = protocol['data']
    scenes, labels = field_scenes(protocol, candidate)
    train_data = draw(scenes, d['field_side'], d['field_px'], pool), torch.from_numpy(labels)
    scenes, labels = held_out_scenes(protocol, 'validation', d['validation_images'], candidate)
    val = draw(scenes, d['test_side'], protocol.train_size, pool), torch.from_numpy(labels)
    scenes, labels = held_out_scenes(protocol, 'pilot_test' if pilot else 'test', d['test_images'], candidate)
    y = torch.from_numpy(labels)
    return train_data, val, {s: (draw(scenes, d['test_side'], s, pool), y) for s in protocol.sizes}


def tests(protocol: Protocol) -> list[Drawn | DrawnResized]:
    """Every check's tests: each size drawn natively ('native96'), then each upsampled size ('upsampled96')."""
    return [*(Drawn(s) for s in protocol.sizes), *(DrawnResized(s) for s in protocol.upsampled)]


def object_scales(protocol: Protocol, crops: int = 20000, pilot: bool = False, candidate: str | None = None) -> dict:
    """Apparent object radii (px) in training crops and in each native test, as percentiles (``LEVELS``), with the
    share of crop objects smaller than each test's median ('crop_share_below': 0.5 where the crops are centred
    on that test) and the share of crops that show no object: ``crops`` boxes drawn as training draws them over
    the training fields (``scenes.crop_radii``), the tests' every shape at the test's size; the objects sized for
    ``candidate``."""
    d = protocol['data']
    scenes, _ = field_scenes(protocol, candidate)
    gen = torch.Generator().manual_seed(0)
    boxes = random_boxes(crops, protocol['crops']['min_area'], gen, protocol['crops']['area'])
    picks = torch.randint(len(scenes), (crops,), generator=gen).tolist()
    radii, empty = crop_radii(scenes, d['field_side'], protocol.train_size, boxes, picks)
    held, _ = held_out_scenes(protocol, 'pilot_test' if pilot else 'test', d['test_images'], candidate)
    unit = np.array([s.r for scene in held for s in scene.shapes])
    out = dict(levels=list(LEVELS), crops=percentiles(radii), empty_crops=round(empty, 3), tests={})
    for size in protocol.sizes:
        r = unit * size / d['test_side']
        out['tests'][Drawn(size).key] = dict(percentiles=percentiles(r),
                                             crop_share_below=round(float((radii < np.median(r)).mean()), 3))
    return out


@torch.inference_mode()
def correct(model, x: torch.Tensor, y: torch.Tensor, test, config: StudyConfig, batch: int = 250) -> torch.Tensor:
    """Per image of ``x``, whether ``model`` classifies ``test``'s rendering of it as ``y`` says (bool, (N,))."""
    model.eval()
    with fp32_precision(config.tf32):
        return torch.cat([model(test.render(x[i:i + batch], config).to(config.device)).argmax(-1).cpu()
                          == y[i:i + batch] for i in range(0, len(x), batch)])


def run(arm: str, seed: int, config: StudyConfig, data, protocol: Protocol, origin: dict | None = None,
        candidate: str | None = None) -> dict:
    """One (arm, seed) of ``config``, trained once (resumable after every epoch, on the accelerator it started
    on) and checked at every epoch's end, each check in the record's ``checks``: validation top-1 ('val') and
    every test (``tests``) on the first ``tests.check_images`` test scenes ('tests'); the final check also on
    every test scene ('final'). The record holds ``origin`` (``provenance``), the protocol's path and sha256, the
    pilot candidate, the scene sets and the shapes' radii ('object_size'); read back where it is there already.
    ``data`` (``load_data``) must be drawn for ``candidate``."""
    run_dir = config.run_dir(arm, seed)
    path = run_dir / 'result.json'
    result = records.read(path)
    if result is not None:
        return result
    if origin is None:
        raise ValueError(f'{arm} seed {seed} is not trained yet: training needs its provenance (origin)')
    check_may_run(protocol, [seed])
    records.start_on(run_dir, dict(accelerator=origin['accelerator'], protocol_sha256=protocol.sha256), TAG,
             f'{arm} seed {seed}')
    (x_val, y_val), drawings = data[1], data[2]
    size, subset = protocol.train_size, protocol['tests']['check_images']

    def after_check(model, check: int) -> dict:
        start, final = time.perf_counter(), check == config.epochs
        val = float(correct(model, x_val, y_val, Given(size), config).float().mean()) * 100
        record = dict(val=round(val, 2), tests={})
        if final:
            record['final'] = {}
        for test in tests(protocol):
            x, y = drawings[test.size if isinstance(test, Drawn) else size]
            hits = correct(model, *((x, y) if final else (x[:subset], y[:subset])), test, config).float()
            record['tests'][test.key] = round(float(hits[:subset].mean()) * 100, 2)
            if final:
                record['final'][test.key] = round(float(hits.mean()) * 100, 2)
        print(f'[{TAG}] {arm} seed {seed} check {check}: validation {val:.2f}; '
              + ', '.join(f'{k} {v:.2f}' for k, v in record.get('final', record['tests']).items()), flush=True)
        return dict(record, seconds=round(time.perf_counter() - start, 1))

    model, result = train(arm, seed, config, data[0], run_dir, after_check, 1)
    sets = protocol['data']['scene_sets']
    result.update(
        eval_seconds=round(sum(c['seconds'] for c in result['checks']), 1), pilot=candidate is not None,
        candidate=candidate, protocol=protocol.path.relative_to(ROOT).as_posix() if protocol.path.is_relative_to(ROOT)
        else str(protocol.path), protocol_sha256=protocol.sha256,
        scene_sets=dict(train=sets['train'], validation=sets['validation'],
                        test=sets['pilot_test' if candidate is not None else 'test']),
        object_size=list(protocol.object_size(candidate)), **origin)
    return records.write(path, result)
