"""The study's design as its protocol gives it: the training configuration (``study_config``), the scene sets
drawn (``load_data``), the tests (``tests``), the object sizes crops and tests show (``object_scales``), and one
run trained and checked at every epoch or at its final one (``run``), each final test scene's true-class
log-probability kept where the protocol asks (``LOG_PROBABILITIES``)."""
import hashlib
import io
import time
from concurrent.futures import Executor

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.confirm_detail.protocol import ROOT, TAG, TASK_FIELDS, Protocol, check_may_run
from benchmarks.study import records
from benchmarks.study.config import StudyConfig
from benchmarks.study.data import random_boxes
from benchmarks.study.scenes import LEVELS, crop_radii, draw, percentiles
from benchmarks.study.specs import Drawn, DrawnResized, Given
from benchmarks.study.trainer import fp32_precision, train
from cpvt_backbones.datasets import class_scenes
from cpvt_backbones.utils import atomic_write

LOG_PROBABILITIES = 'final_logprob.npz'   # per run: every final test's true-class log-probability per scene


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
def correct(model, x: torch.Tensor, y: torch.Tensor, test, config: StudyConfig, batch: int = 250,
            log_probabilities: bool = False):
    """Per image of ``x``, whether ``model`` classifies ``test``'s rendering of it as ``y`` says (bool, (N,)); with
    ``log_probabilities`` also the log-probability the model gives the class ``y`` says (float32, (N,))."""
    model.eval()
    hits, scores = [], []
    with fp32_precision(config.tf32):
        for i in range(0, len(x), batch):
            logits = model(test.render(x[i:i + batch], config).to(config.device)).cpu()
            hits.append(logits.argmax(-1) == y[i:i + batch])
            if log_probabilities:
                scores.append(F.log_softmax(logits.float(), -1).gather(1, y[i:i + batch, None].to(torch.int64))[:, 0])
    return (torch.cat(hits), torch.cat(scores)) if log_probabilities else torch.cat(hits)


def write_log_probabilities(path, scores: dict[str, torch.Tensor]) -> str:
    """``scores`` ({test key: per-scene log-probability}) written to ``path`` as one compressed .npz, whole or not
    at all; returns the sha256 of its bytes."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{k: v.numpy().astype(np.float32) for k, v in scores.items()})
    atomic_write(path, buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def run(arm: str, seed: int, config: StudyConfig, data, protocol: Protocol, origin: dict | None = None,
        candidate: str | None = None) -> dict:
    """One (arm, seed) of ``config`` (with the arm's own fields, ``Protocol.arm_recipe``), trained once
    (resumable after every epoch, on the accelerator it started on) and checked at every epoch's end
    (``tests.checks_per_epoch`` 1) or at the final epoch's alone (0), each check in the record's ``checks``:
    validation top-1 ('val') and every test (``tests``) on the first ``tests.check_images`` test scenes
    ('tests'); the final check also on every test scene ('final'), and with ``tests.log_probabilities`` each of
    those scenes' true-class log-probability per test in ``LOG_PROBABILITIES`` beside the record (its sha256 in
    'log_probabilities'). The record holds ``origin`` (``provenance``), the protocol's path and sha256, the pilot
    candidate, the scene sets and the shapes' radii ('object_size'); read back where it is there already.
    ``data`` (``load_data``) must be drawn for ``candidate``."""
    config = config.replace(**protocol.arm_recipe(arm, candidate))
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
    keep = protocol['tests'].get('log_probabilities', False)
    scores: dict[str, torch.Tensor] = {}

    def after_check(model, check: int, final: bool | None = None) -> dict:
        start, final = time.perf_counter(), check == config.epochs if final is None else final
        val = float(correct(model, x_val, y_val, Given(size), config).float().mean()) * 100
        record = dict(val=round(val, 2), tests={})
        if final:
            record['final'] = {}
        for test in tests(protocol):
            x, y = drawings[test.size if isinstance(test, Drawn) else size]
            if final and keep:
                hits, scores[test.key] = correct(model, x, y, test, config, log_probabilities=True)
            else:
                hits = correct(model, *((x, y) if final else (x[:subset], y[:subset])), test, config)
            hits = hits.float()
            record['tests'][test.key] = round(float(hits[:subset].mean()) * 100, 2)
            if final:
                record['final'][test.key] = round(float(hits.mean()) * 100, 2)
        print(f'[{TAG}] {arm} seed {seed} check {check}: validation {val:.2f}; '
              + ', '.join(f'{k} {v:.2f}' for k, v in record.get('final', record['tests']).items()), flush=True)
        return dict(record, seconds=round(time.perf_counter() - start, 1))

    if protocol.checks_per_epoch:
        model, result = train(arm, seed, config, data[0], run_dir, after_check, 1)
    else:   # trained (or resumed) to its end, then its one check
        model, result = train(arm, seed, config, data[0], run_dir)
        result['checks'] = [dict(check=1, epoch=config.epochs, **after_check(model, 1, final=True))]
    if keep:
        result['log_probabilities'] = dict(file=LOG_PROBABILITIES, scenes=len(drawings[size][1]),
                                           sha256=write_log_probabilities(run_dir / LOG_PROBABILITIES, scores))
    sets = protocol['data']['scene_sets']
    result.update(
        eval_seconds=round(sum(c['seconds'] for c in result['checks']), 1), pilot=candidate is not None,
        candidate=candidate, protocol=protocol.path.relative_to(ROOT).as_posix() if protocol.path.is_relative_to(ROOT)
        else str(protocol.path), protocol_sha256=protocol.sha256,
        scene_sets=dict(train=sets['train'], validation=sets['validation'],
                        test=sets['pilot_test' if candidate is not None else 'test']),
        object_size=list(protocol.object_size(candidate)), **origin)
    return records.write(path, result)
