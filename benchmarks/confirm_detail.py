"""The native-detail result confirmed: every encoding trained until it learns the task, detail told from scale, one
preregistered run (``benchmarks/protocols/confirm_detail.json``).

    python -m benchmarks.confirm_detail [--protocol FILE] [--pilot] [--shard K/N] [--device cpu|cuda]
        [--tf32 off] [--jobs N] [--threads T] [--work-dir DIR] [--out DIR]
    python -m benchmarks.confirm_detail [--protocol FILE] --scales

Everything the study does comes from its protocol file (``Protocol``), read by this module and hashed (sha256 of
the file's bytes): the arms, seeds, recipe, scene sets, tests, analysis and the rule for each claim. The task is
``native_detail``'s (which of four shapes a scene shows, every image drawn natively at the size it is used at,
``benchmarks.study.scenes``); what the protocol changes:

* **Scale matched.** Training crops (log-uniform areas ``crops.min_area``..1 of fields ``data.field_side`` units
  square drawn at ``data.field_px``, resized to 56 px, none upsampled) show objects whose sizes are centred on
  the 1x test's: ``object_scales`` measures the apparent radii of crops and of every test and ``--scales``
  prints them (the report does too).
* **Detail told from scale.** Every check is tested at each size on the native drawing ('native96') and on the
  1x drawing upsampled to that size ('upsampled96': the same objects at the same size and token grid, with the
  1x drawing's detail). Gain from detail = native - upsampled, paired by seed, per arm and size; gain from scale
  = upsampled - native 56. Training blurs up a share of its crops the way the upsampled tests are made
  (``StudyConfig.blur_up``), so the upsampled tests are in distribution for every arm.
* **Every epoch tested, claims from the final one.** One check an epoch, each validated (56 px drawings of the
  validation set) and tested on every test (every check on the first ``tests.check_images`` test scenes, the
  final one also on all of them); no check is selected: the claims read the final epoch on every test scene, and
  the report draws each arm's gain against its start (top-1 at 56 px) at every check beside the final-epoch
  table.
* **Statistics.** Paired 95% t intervals; Holm's correction over the protocol's named contrasts
  (``benchmarks.study.stats``); a claim holds ("clearly more", "less") only where its Holm-adjusted interval
  excludes zero on the claimed side.

Pilot and confirmatory runs. ``--pilot`` runs the protocol's pilot: its arms, each candidate recipe (the recipe
with the candidate's changes) and its seeds (>= ``PILOT_SEEDS``), tested on the pilot test set, under the name
``pilot.name``; a draft protocol is enough. Without ``--pilot`` the confirmatory grid (the protocol's arms and
seeds 0-4, its recipe, its test set, under ``name``) runs only under a protocol whose status is 'fixed'. Every
run records the protocol's sha256 and a study whose recorded hash differs from the file's is refused: a changed
protocol needs a new name. The recipe is fixed from the pilots (``pilot_choice``: the first candidate under which
the arms of ``learns`` reach within ``learns.within`` points of its reference on validation at 56 px at the
final epoch, else the nearest).

Resumable and sharded (``--shard K/N``: every N-th run; each run resumes after its last finished epoch, on the
accelerator it started on); each run records the accelerator, torch's version and the clean commit it ran from
(``benchmarks.study.common.provenance``); its record (result.json, started_on.json) is kept in git, its weights
(checkpoint.pth, final.pth) are not. The outputs (NAME.{json,md,csv,png}) are written by whichever invocation
finds every run done, from a clean tree only; they record the rendering commit apart from the runs' commits.
"""
import argparse
import hashlib
import json
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.study.common import (
    add_run_options,
    committed,
    format_paired,
    mean_std,
    parse_shard,
    provenance,
    run_meta,
)
from benchmarks.study.config import VARIANTS, StudyConfig
from benchmarks.study.data import random_boxes
from benchmarks.study.grid import Grid, start_on, write_report
from benchmarks.study.pool import drawing_pool, map_shared
from benchmarks.study.report import line_style
from benchmarks.study.scenes import LEVELS, crop_radii, draw, percentiles
from benchmarks.study.specs import Drawn, DrawnResized, Given
from benchmarks.study.stats import holm, interval, paired_test
from benchmarks.study.trainer import fp32_precision, train
from cpvt_backbones.datasets import class_scenes
from cpvt_backbones.utils import atomic_write, pyplot

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / 'benchmarks/protocols/confirm_detail.json'
PILOT_SEEDS = 100                    # pilot seeds are >= this; confirmatory seeds below it
STATUSES = ('draft', 'fixed')
# The recipe's fields and their types; each sets the StudyConfig field of its name (warmup_epochs sets warmup, as
# its share of the epochs).
RECIPE = dict(epochs=int, warmup_epochs=(int, float), batch_size=int, lr=float, weight_decay=float,
              drop_path=float, dim=int, depth=int, heads=int, patch=int, stem_layers=int)
MEASURES = ('start', 'detail', 'scale', 'change', 'val')
DIRECTIONS = ('+', '-', 'either')
SCENE_SETS = ('train', 'validation', 'test', 'pilot_test')
TAG = 'confirm'


class ProtocolError(ValueError):
    """A protocol file the study cannot run: the message names the entry."""


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ProtocolError(message)


@dataclass(frozen=True)
class Protocol:
    """A study's protocol: the parsed file (``data``), where it lies (``path``) and the sha256 of its bytes."""
    data: dict
    path: Path
    sha256: str

    @classmethod
    def load(cls, path: Path | str) -> 'Protocol':
        """The protocol at ``path``, checked (``check``); SystemExit where there is no file (the study runs only
        from one), ProtocolError naming a malformed entry."""
        path = Path(path).resolve()
        if not path.is_file():
            raise SystemExit(f'[{TAG}] no protocol at {path}: the study runs only from its protocol file')
        raw = path.read_bytes()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ProtocolError(f'{path}: not JSON ({e})') from e
        protocol = cls(data, path, hashlib.sha256(raw).hexdigest())
        try:
            protocol.check()
        except (KeyError, TypeError, AttributeError) as e:
            raise ProtocolError(f'{path}: a missing or malformed entry ({type(e).__name__}: {e})') from e
        return protocol

    def __getitem__(self, key: str):
        return self.data[key]

    @property
    def status(self) -> str:
        return self.data['status']

    @property
    def arms(self) -> tuple[str, ...]:
        return tuple(self.data['arms'])

    @property
    def sizes(self) -> tuple[int, ...]:
        """The test sizes (px), the training size first."""
        return tuple(self.data['tests']['native'])

    @property
    def train_size(self) -> int:
        return self.data['crops']['size']

    @property
    def upsampled(self) -> tuple[int, ...]:
        return tuple(self.data['tests']['upsampled'])

    def recipe(self, candidate: str | None = None) -> dict:
        """The recipe, with the pilot candidate ``candidate``'s changes where given."""
        return dict(self.data['recipe'], **(self.data['pilot']['recipes'][candidate] if candidate else {}))

    def check(self) -> None:
        """ProtocolError naming the first entry the study cannot run: missing or unknown keys, arms, seeds on the
        wrong side of ``PILOT_SEEDS``, scene sets shared with each other or with earlier studies, sizes, a crop
        that would be upsampled, blur-up sizes other than the upsampled tests', contrasts or claims naming what
        does not exist."""
        d = self.data
        keys = {'format', 'name', 'status', 'question', 'design', 'arms', 'seeds', 'recipe', 'pilot', 'data',
                'crops', 'blur_up', 'tests', 'analysis', 'learns', 'claims'}
        _need(isinstance(d, dict) and not keys - set(d), f'{self.path}: needs the entries {sorted(keys)}; missing '
              f'{sorted(keys - set(d)) if isinstance(d, dict) else "all"}')
        _need(d['format'] == 1, f'format must be 1, got {d["format"]!r}')
        _need(d['status'] in STATUSES, f'status must be one of {STATUSES}, got {d["status"]!r}')
        for name in (d['name'], d['pilot'].get('name')):
            _need(isinstance(name, str) and name.replace('_', '').replace('-', '').isalnum(),
                  f'a study name must be letters, digits, - and _, got {name!r}')
        _need(d['name'] != d['pilot']['name'], 'the pilot needs a name of its own')
        unknown = [a for a in (*d['arms'], *d['pilot'].get('arms', ())) if a not in VARIANTS]
        _need(not unknown, f'unknown arm(s) {unknown}: one of {", ".join(VARIANTS)}')
        _need(len(set(d['arms'])) == len(d['arms']) and set(d['pilot'].get('arms', ())) <= set(d['arms']),
              'arms must be distinct, and the pilot\'s arms the study\'s')
        seeds, pilot_seeds = d['seeds'], d['pilot'].get('seeds', [])
        _need(bool(seeds) and all(isinstance(s, int) and 0 <= s < PILOT_SEEDS for s in seeds),
              f'the confirmatory seeds must lie in 0..{PILOT_SEEDS - 1}, got {seeds}')
        _need(bool(pilot_seeds) and all(isinstance(s, int) and s >= PILOT_SEEDS for s in pilot_seeds),
              f'the pilot\'s seeds must be >= {PILOT_SEEDS}, got {pilot_seeds}')
        for recipe in (d['recipe'], *d['pilot'].get('recipes', {}).values()):
            wrong = sorted(k for k, v in recipe.items() if k not in RECIPE or not isinstance(v, RECIPE[k])
                           or isinstance(v, bool))
            _need(not wrong, f'recipe entries {wrong}: not one of {sorted(RECIPE)} with its type')
        _need(set(d['recipe']) == set(RECIPE), f'the recipe needs every entry of {sorted(RECIPE)}')
        _need(bool(d['pilot'].get('recipes')), 'the pilot needs at least one candidate recipe (none: {})')
        sets = d['data']['scene_sets']
        _need(set(sets) == set(SCENE_SETS), f'data.scene_sets needs {SCENE_SETS}')
        _need(len(set(sets.values())) == len(sets), f'the scene sets must be distinct, got {sets}')
        reused = sorted(set(sets.values()) & set(d['data']['earlier_scene_sets']))
        _need(not reused, f'scene sets {reused} are earlier studies\' (data.earlier_scene_sets)')
        size, sizes = d['crops']['size'], d['tests']['native']
        _need(sizes[0] == size and sorted(set(sizes)) == list(sizes),
              f'tests.native must rise from the training size {size}, got {sizes}')
        _need(bool(d['tests']['upsampled']) and set(d['tests']['upsampled']) == {s for s in sizes if s > size},
              f'tests.upsampled must be every native size above {size}, got {d["tests"]["upsampled"]}')
        _need(sorted(d['blur_up']['sizes']) == sorted(d['tests']['upsampled']) and 0 <= d['blur_up']['share'] <= 1,
              'blur_up draws crops as the upsampled tests are drawn: its sizes are tests.upsampled, its share in '
              '[0, 1]')
        _need(d['tests']['checks_per_epoch'] == 1, 'the study tests one check an epoch (tests.checks_per_epoch 1)')
        _need(1 <= d['tests']['check_images'] <= d['data']['test_images'],
              'tests.check_images (the test scenes every check reads) must lie in 1..data.test_images')
        shortest = d['data']['field_px'] * d['crops']['min_area'] ** 0.5
        _need(shortest >= size - 1e-6, f'the smallest crop (its side at aspect 1: {shortest:.3f} px of a field at '
              f'data.field_px) would be upsampled to {size} px')
        _need(d['analysis']['epoch'] == 'final' and 0 < d['analysis']['confidence'] < 1,
              'the analysis reads the final epoch (analysis.epoch "final") at a confidence in (0, 1)')
        contrasts = d['analysis']['contrasts']
        ids = [c['id'] for c in contrasts]
        _need(len(set(ids)) == len(ids) and bool(ids), 'the analysis needs contrasts with distinct ids')
        for c in contrasts:
            _need(c['measure'] in MEASURES, f'contrast {c["id"]}: measure must be one of {MEASURES}')
            _need(c['a'] in d['arms'] and c.get('b', c['a']) in d['arms'], f'contrast {c["id"]}: unknown arm')
            _need(c['measure'] in ('start', 'val') or c.get('size') in d['tests']['upsampled'],
                  f'contrast {c["id"]}: size must be one of tests.upsampled')
        for claim in d['claims']:
            _need(claim['contrast'] in ids and claim['direction'] in DIRECTIONS,
                  f'claim {claim["id"]}: names contrast {claim["contrast"]!r} and direction {claim["direction"]!r}; '
                  f'contrasts {ids}, directions {DIRECTIONS}')
        learns = d['learns']
        _need(learns['reference'] in d['arms'] and set(learns['arms']) <= set(d['arms']),
              'learns: its arms and reference must be arms')


def check_may_run(protocol: Protocol, seeds: Sequence[int]) -> None:
    """Refuses (SystemExit) confirmatory seeds (below ``PILOT_SEEDS``) under a draft protocol: only pilots run
    before the protocol is fixed."""
    confirmatory = sorted(s for s in seeds if s < PILOT_SEEDS)
    if confirmatory and protocol.status != 'fixed':
        raise SystemExit(f'[{TAG}] {protocol.path} is a {protocol.status}: confirmatory seeds {confirmatory} run only '
                         f'under a fixed protocol (pilot seeds are >= {PILOT_SEEDS})')


def check_study_protocol(study_dir: Path, protocol: Protocol) -> None:
    """Refuses (SystemExit) to continue the study under ``study_dir`` where any of its runs (started_on.json or
    result.json) records another protocol hash than the file's: a changed protocol needs a new study name."""
    other = sorted({str(path.parent.relative_to(study_dir)) for name in ('started_on.json', 'result.json')
                    for path in study_dir.rglob(name)
                    if json.loads(path.read_text()).get('protocol_sha256') != protocol.sha256})
    if other:
        raise SystemExit(f'[{TAG}] runs of {study_dir.name} were started under another protocol than {protocol.path} '
                         f'(sha256 {protocol.sha256[:12]}): {", ".join(other[:6])}{" ..." if len(other) > 6 else ""}.'
                         ' A changed protocol needs a new study name (its name, or pilot.name)')


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
        **{k: v for k, v in recipe.items() if k != 'warmup_epochs'}, **fields)


def field_scenes(protocol: Protocol):
    """The training fields and their labels: scene set ``train``, ``data.field_side`` units square, with
    ``data.field_objects`` objects of the test scenes' radii in units (about the test scenes' density)."""
    d = protocol['data']
    size = tuple(round(s * d['test_side'] / d['field_side'], 4) for s in d['object_size'])
    return class_scenes(d['train_fields'], d['field_side'], d['scene_sets']['train'], tuple(d['field_objects']),
                        size)


def held_out_scenes(protocol: Protocol, which: str, count: int):
    """``count`` scenes of the scene set ``which`` ('validation', 'test', 'pilot_test') and their labels."""
    d = protocol['data']
    return class_scenes(count, d['test_side'], d['scene_sets'][which], tuple(d['objects']), tuple(d['object_size']))


def load_data(protocol: Protocol, pilot: bool, pool: Executor | None = None):
    """(training fields at ``data.field_px`` and labels, validation at the training size and labels, {test size:
    (the test set drawn at that size, labels)}); the pilot's tests are the pilot test set's."""
    d = protocol['data']
    scenes, labels = field_scenes(protocol)
    train_data = draw(scenes, d['field_side'], d['field_px'], pool), torch.from_numpy(labels)
    scenes, labels = held_out_scenes(protocol, 'validation', d['validation_images'])
    val = draw(scenes, d['test_side'], protocol.train_size, pool), torch.from_numpy(labels)
    scenes, labels = held_out_scenes(protocol, 'pilot_test' if pilot else 'test', d['test_images'])
    y = torch.from_numpy(labels)
    return train_data, val, {s: (draw(scenes, d['test_side'], s, pool), y) for s in protocol.sizes}


def tests(protocol: Protocol) -> list[Drawn | DrawnResized]:
    """Every check's tests: each size drawn natively ('native96'), then each upsampled size ('upsampled96')."""
    return [*(Drawn(s) for s in protocol.sizes), *(DrawnResized(s) for s in protocol.upsampled)]


def object_scales(protocol: Protocol, crops: int = 20000, pilot: bool = False) -> dict:
    """Apparent object radii (px) in training crops and in each native test, as percentiles (``LEVELS``), with the
    share of crop objects smaller than each test's median ('crop_share_below': 0.5 where the crops are centred
    on that test) and the share of crops that show no object: ``crops`` boxes drawn as training draws them over
    the training fields (``scenes.crop_radii``), the tests' every shape at the test's size."""
    d = protocol['data']
    scenes, _ = field_scenes(protocol)
    gen = torch.Generator().manual_seed(0)
    boxes = random_boxes(crops, protocol['crops']['min_area'], gen, protocol['crops']['area'])
    picks = torch.randint(len(scenes), (crops,), generator=gen).tolist()
    radii, empty = crop_radii(scenes, d['field_side'], protocol.train_size, boxes, picks)
    held, _ = held_out_scenes(protocol, 'pilot_test' if pilot else 'test', d['test_images'])
    unit = np.array([s.r for scene in held for s in scene.shapes])
    out = dict(levels=list(LEVELS), crops=percentiles(radii), empty_crops=round(empty, 3), tests={})
    for size in protocol.sizes:
        r = unit * size / d['test_side']
        out['tests'][Drawn(size).key] = dict(percentiles=percentiles(r),
                                             crop_share_below=round(float((radii < np.median(r)).mean()), 3))
    return out


def scales_text(scales: dict) -> str:
    """``object_scales`` as one paragraph."""
    return ('Apparent object radius (px), percentiles ' + '/'.join(map(str, scales['levels'])) + ': training crops '
            + ' / '.join(map(str, scales['crops'])) + f' ({scales["empty_crops"]:.1%} of crops show no object); '
            + '; '.join(f'{heading(k)} ' + ' / '.join(map(str, t['percentiles'])) + ' (share of crop objects '
                        f'smaller than its median: {t["crop_share_below"]:.2f})' for k, t in scales['tests'].items())
            + '.')


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
    pilot candidate and the scene sets; read back where it is there already."""
    run_dir = config.run_dir(arm, seed)
    path = run_dir / 'result.json'
    if path.is_file():
        return json.loads(path.read_text())
    if origin is None:
        raise ValueError(f'{arm} seed {seed} is not trained yet: training needs its provenance (origin)')
    check_may_run(protocol, [seed])
    start_on(run_dir, dict(accelerator=origin['accelerator'], protocol_sha256=protocol.sha256), TAG,
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
                        test=sets['pilot_test' if candidate is not None else 'test']), **origin)
    atomic_write(path, json.dumps(result, indent=2).encode())
    return result


# -- analysis ---------------------------------------------------------------------------------------------------


def measure(check: dict, name: str, size: int | None, train_size: int, on: str = 'final') -> float:
    """One check's value of a measure, from its tests ``on`` ('final': every test scene, the final check's;
    'tests': the first ``tests.check_images``, every check's): 'start' (native top-1 at the training size), 'val'
    (validation top-1), 'detail' (native - upsampled at ``size``), 'scale' (upsampled at ``size`` - start),
    'change' (native at ``size`` - start)."""
    t = check[on]
    start = t[Drawn(train_size).key]
    if name == 'start':
        return start
    if name == 'val':
        return check['val']
    native, upsampled = t[Drawn(size).key], t[DrawnResized(size).key]
    return {'detail': native - upsampled, 'scale': upsampled - start, 'change': native - start}[name]


def final_check(result: dict) -> dict:
    """A run's final check (its last epoch's); a ValueError where the run's checks stop before its last epoch."""
    last = result['checks'][-1]
    if last['epoch'] != result['epochs']:
        raise ValueError(f'{result["variant"]} seed {result["seed"]}: the last check is at epoch {last["epoch"]}, '
                         f'not the final epoch {result["epochs"]}')
    return last


def by_arm(results: list[dict], arms: Sequence[str]) -> dict[str, list[dict]]:
    """Each arm's runs in seed order; a ValueError where the arms do not share their seeds (the pairing)."""
    runs = {a: sorted((r for r in results if r['variant'] == a), key=lambda r: r['seed']) for a in arms}
    seeds = {a: [r['seed'] for r in rs] for a, rs in runs.items()}
    if len({tuple(s) for s in seeds.values()}) != 1 or not next(iter(seeds.values())):
        raise ValueError(f'every arm needs runs of the same seeds (paired by seed), got {seeds}')
    return runs


def _paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
    test = paired_test(a, b)
    lo, hi = interval(test, level)
    return dict(mean=round(test['mean'], 2), lo=_round(lo), hi=_round(hi), n=test['n'], p=test['p'],
                sign='=' if lo is None or lo <= 0 <= hi else '+' if lo > 0 else '-')


def summarise(results: list[dict], protocol: Protocol, arms: Sequence[str]) -> dict:
    """The final-epoch analysis of ``results`` (``arms``' runs, paired by seed): per arm its start, validation
    and training top-1 ('arms'); per arm and upsampled size native and upsampled top-1 (mean, sd, per seed) with
    the gains from detail and from scale and the change, each paired with its 95% interval ('rows'); the
    protocol's contrasts, Holm-corrected over its family ('contrasts'); each claim's verdict ('claims'); the
    learning rule ('learns'); and each arm's curve, one point per check: mean start, gain from detail and change
    per size ('curves')."""
    size = protocol.train_size
    runs = by_arm(results, arms)
    final = {a: [final_check(r) for r in rs] for a, rs in runs.items()}
    arm_rows = {}
    for a, checks in final.items():
        start, val = [measure(c, 'start', None, size) for c in checks], [c['val'] for c in checks]
        trained = [r['log'][-1]['train_top1'] for r in runs[a]]
        arm_rows[a] = dict(arm=a, seeds=[r['seed'] for r in runs[a]], start=mean_std(start), start_per_seed=start,
                           val=mean_std(val), val_per_seed=val, train_top1=mean_std(trained))
    rows = []
    for a, checks in final.items():
        for s in protocol.upsampled:
            native = [c['final'][Drawn(s).key] for c in checks]
            upsampled = [c['final'][DrawnResized(s).key] for c in checks]
            start = arm_rows[a]['start_per_seed']
            rows.append(dict(arm=a, size=s, native=mean_std(native), upsampled=mean_std(upsampled),
                             native_per_seed=native, upsampled_per_seed=upsampled,
                             detail=_paired(native, upsampled), scale=_paired(upsampled, start),
                             change=_paired(native, start)))
    contrasts = analyse_contrasts(final, protocol)
    claims = [dict(claim, verdict=verdict(contrasts[claim['contrast']], claim['direction']))
              for claim in protocol['claims'] if claim['contrast'] in contrasts]
    return dict(arms=arm_rows, rows=rows, contrasts=contrasts, claims=claims, learns=learns(arm_rows, protocol),
                curves=curves(runs, protocol))


def analyse_contrasts(final: dict[str, list[dict]], protocol: Protocol) -> dict[str, dict]:
    """Each of the protocol's contrasts among the arms in ``final`` (each arm's final checks, paired by seed):
    the per-seed values (a's measure, less b's where it names b), the paired mean with its 95% interval, and
    Holm's adjusted interval and p-value over the family of those contrasts (``stats.holm``)."""
    size, alpha = protocol.train_size, 1 - protocol['analysis']['confidence']
    named = [c for c in protocol['analysis']['contrasts'] if c['a'] in final and c.get('b', c['a']) in final]
    values, paired = {}, {}
    for c in named:
        a = [measure(check, c['measure'], c.get('size'), size) for check in final[c['a']]]
        b = [measure(check, c['measure'], c.get('size'), size) for check in final[c['b']]] if c.get('b') \
            else [0.] * len(a)
        values[c['id']] = [x - y for x, y in zip(a, b, strict=True)]
        paired[c['id']] = paired_test(a, b)
    adjusted = holm(paired, alpha)
    out = {}
    for c in named:
        test, adj = paired[c['id']], adjusted[c['id']]
        lo, hi = interval(test, 1 - alpha)
        out[c['id']] = dict(c, per_seed=[round(v, 2) for v in values[c['id']]], mean=round(test['mean'], 2),
                            lo=_round(lo), hi=_round(hi), p=test['p'], holm_lo=_round(adj['lo']),
                            holm_hi=_round(adj['hi']), holm_level=adj['level'], p_holm=adj['p_holm'],
                            sign=adj['sign'])
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def verdict(contrast: dict, direction: str) -> str:
    """'holds' where the contrast's Holm-adjusted interval excludes zero on the claimed side ('either': on
    either), 'reversed' where it excludes zero on the other, else 'not shown'."""
    sign = contrast['sign']
    if sign == '=':
        return 'not shown'
    return 'holds' if direction in ('either', sign) else 'reversed'


def learns(arm_rows: dict, protocol: Protocol) -> dict:
    """The learning rule: each of ``learns.arms`` against ``learns.reference`` on validation top-1 at the final
    epoch (mean over seeds): the gap (reference - arm) and whether it is within ``learns.within`` points."""
    rule = protocol['learns']
    if rule['reference'] not in arm_rows:
        return dict(rule, gaps={}, holds=None)
    ref = arm_rows[rule['reference']]['val'][0]
    gaps = {a: round(ref - arm_rows[a]['val'][0], 2) for a in rule['arms'] if a in arm_rows}
    return dict(rule, gaps=gaps, holds=all(g <= rule['within'] for g in gaps.values()) if gaps else None)


def curves(runs: dict[str, list[dict]], protocol: Protocol) -> dict[str, list[dict]]:
    """Per arm, one point per check (the checks every seed has): its epoch and the mean over seeds of the start,
    the validation, and per upsampled size the gain from detail and the change, each check read on the same
    ``tests.check_images`` test scenes."""
    size, out = protocol.train_size, {}
    for a, rs in runs.items():
        count = min(len(r['checks']) for r in rs)
        points = []
        for i in range(count):
            checks = [r['checks'][i] for r in rs]

            def mean(name: str, at: int | None = None, checks=checks) -> float:
                return round(float(np.mean([measure(c, name, at, size, 'tests') for c in checks])), 2)
            points.append(dict(epoch=checks[0]['epoch'], start=mean('start'), val=mean('val'),
                               detail={str(s): mean('detail', s) for s in protocol.upsampled},
                               change={str(s): mean('change', s) for s in protocol.upsampled}))
        out[a] = points
    return out


def pilot_choice(summaries: dict[str, dict]) -> dict:
    """The recipe the pilot fixes, from each candidate's learning rule (``summaries``: {candidate: summary}, in
    the protocol's order): the first whose rule holds, else the one whose largest gap is smallest ('holds'
    False)."""
    gaps = {c: max(s['learns']['gaps'].values()) for c, s in summaries.items() if s['learns']['gaps']}
    if not gaps:
        return dict(candidate=None, holds=None, gaps={})
    held = [c for c in summaries if summaries[c]['learns']['holds']]
    chosen = held[0] if held else min(gaps, key=gaps.get)
    return dict(candidate=chosen, holds=bool(held), gaps=gaps)


# -- the report -------------------------------------------------------------------------------------------------


def heading(key: str) -> str:
    kind, size = ('native', int(key[6:])) if key.startswith('native') else ('upsampled', int(key[9:]))
    return f'{"drawn" if kind == "native" else "1x drawing upsampled to"} {size} px'


def _ms(pair: tuple[float, float]) -> str:
    return f'{pair[0]:.2f} ± {pair[1]:.2f}'


def _holm(c: dict) -> str:
    if c['holm_lo'] is None:
        return f'{c["mean"]:+.2f}'
    return f'{c["mean"]:+.2f} [{c["holm_lo"]:+.2f}, {c["holm_hi"]:+.2f}]'


def _contrast_name(c: dict) -> str:
    what = {'detail': 'gain from detail', 'scale': 'gain from scale', 'change': 'change', 'start': 'top-1 at start',
            'val': 'validation top-1'}[c['measure']]
    at = f' at {c["size"]} px' if c['measure'] not in ('start', 'val') else ''
    return f'{what}{at}: {c["a"]}' + (f' − {c["b"]}' if c.get('b') else '')


def render_summary(summary: dict, protocol: Protocol, arms: Sequence[str]) -> list[str]:
    """One analysis as Markdown lines: the learning rule, the final-epoch table, the contrasts and the claims."""
    rule = summary['learns']
    lines = []
    if rule['gaps']:
        lines += [f'**Every arm learns the task** (validation top-1 at {protocol.train_size} px, final epoch, mean '
                  f'over seeds; {", ".join(rule["arms"])} within {rule["within"]:.0f} points of '
                  f'{rule["reference"]}): ' + ('holds' if rule['holds'] else 'does not hold') + ' (gaps: '
                  + ', '.join(f'{a} {g:+.2f}' for a, g in rule['gaps'].items()) + ').', '']
    sizes = protocol.upsampled
    lines += ['| arm | validation | training top-1 | drawn 56 px (start) | '
              + ' | '.join(f'{s} px: native / upsampled | {s} px: gain from detail | {s} px: gain from scale'
                           for s in sizes) + ' |', '|---|---|---|---|' + '---|---|---|' * len(sizes)]
    for a in arms:
        row = summary['arms'][a]
        cells = []
        for r in (r for r in summary['rows'] if r['arm'] == a):
            cells += [f'{_ms(r["native"])} / {_ms(r["upsampled"])}', format_paired(r['detail']),
                      format_paired(r['scale'])]
        lines.append(f'| {VARIANTS[a].label} | {_ms(row["val"])} | {_ms(row["train_top1"])} | {_ms(row["start"])} | '
                     + ' | '.join(cells) + ' |')
    contrasts = summary['contrasts']
    if contrasts:
        lines += ['', f'**Contrasts** (paired by seed; Holm over these {len(contrasts)}):', '',
                  '| contrast | per seed | mean [95%] | Holm-adjusted [interval] | p | p (Holm) |',
                  '|---|---|---|---|---|---|']
        for c in contrasts.values():
            p = '' if c['p'] is None else f'{c["p"]:.4f}'
            lines.append(f'| {_contrast_name(c)} | {", ".join(f"{v:+.2f}" for v in c["per_seed"])} | '
                         f'{format_paired(c)} | {_holm(c)}{" =" if c["sign"] == "=" else ""} | {p} | '
                         f'{c["p_holm"]:.4f} |')
    if summary['claims']:
        lines += ['', '**Claims** (each holds only where its Holm-adjusted interval excludes zero on its side):', '']
        lines += [f'* {c["text"]} **{c["verdict"]}** ({_contrast_name(contrasts[c["contrast"]])}: '
                  f'{_holm(contrasts[c["contrast"]])}).' for c in summary['claims']]
    return lines


def render_markdown(document: dict, protocol: Protocol) -> str:
    meta = document['meta']
    lines = [f'Protocol `{meta["protocol"]}` (sha256 {meta["protocol_sha256"][:12]}, {meta["status"]}); '
             f'{"pilot" if meta["pilot"] else "confirmatory"} study `{meta["name"]}`, seeds {meta["seeds"]}.', '']
    if meta['pilot']:
        choice = document['choice']
        lines += [f'**The recipe the pilot fixes**: {choice["candidate"]} ('
                  + ('its learning rule holds' if choice['holds'] else 'no candidate\'s learning rule holds: the '
                     'smallest largest gap') + '; largest gap per candidate: '
                  + ', '.join(f'{c} {g:+.2f}' for c, g in choice['gaps'].items()) + ').', '']
    else:
        lines += [f'Recipe: `{json.dumps(protocol.recipe())}`.', '']
    for candidate, summary in document['summaries'].items():
        if meta['pilot']:
            lines += [f'### Candidate `{candidate}`: `{json.dumps(protocol.recipe(candidate))}`', '']
        lines += render_summary(summary, protocol, meta['arms']) + ['']
    lines += [scales_text(meta['object_scales']), '',
              f'Top-1 (%) at the final epoch (no check selected) on {meta["test_images"]} held-out scenes (scene set '
              f'{meta["test_set"]}), mean ± standard deviation over seeds; validation on {meta["validation_images"]} '
              f'scenes of set {meta["validation_set"]} drawn at {protocol.train_size} px. Gain from detail: drawn '
              f'natively minus the {protocol.train_size} px drawing upsampled, gain from scale: upsampled minus drawn '
              f'at {protocol.train_size} px, each paired by seed with its 95% interval; `=`: the adjusted interval '
              f'includes zero. Trained on {meta["train_fields"]} fields of set {meta["train_set"]}, '
              f'{", ".join(map(str, meta["iterations"]))} iterations, on {meta["accelerator"]}, torch '
              f'{", ".join(meta["torch"])}; runs at commit {", ".join(c[:10] for c in meta["run_commits"])}; '
              f'rendered at commit '
              f'{meta["rendered_at"][:10]}. Parameters: {meta["params"]}. Run time summed over the runs: '
              f'{meta["run_minutes"]} min (training {meta["train_minutes"]}, checks {meta["check_minutes"]}).',
              '', f'`{meta["command"]}`', '']
    return '\n'.join(lines)


def plot(document: dict, protocol: Protocol, path: Path, candidate: str) -> None:
    """Each arm's gain from detail (top) and change (bottom) against its start, one point per check (mean over
    seeds), per upsampled size; the final check ringed."""
    plt = pyplot()
    summary, sizes = document['summaries'][candidate], protocol.upsampled
    fig, axes = plt.subplots(2, len(sizes), figsize=(4.2 * len(sizes), 7.4), squeeze=False)
    for row, (key, label) in enumerate((('detail', 'gain from detail: native − upsampled'),
                                        ('change', f'change from {protocol.train_size} px, native'))):
        for ax, s in zip(axes[row], sizes, strict=True):
            for i, (a, points) in enumerate(summary['curves'].items()):
                style = dict(line_style(a, plt), color=plt.cm.tab10(i % 10))
                xs, ys = [p['start'] for p in points], [p[key][str(s)] for p in points]
                ax.plot(xs, ys, label=VARIANTS[a].label, **style)
                ax.plot(xs[-1:], ys[-1:], marker='o', ms=10, mfc='none', color=style['color'])
            ax.axhline(0, color='grey', lw=0.8)
            ax.set_title(f'{label}, {s} px', fontsize=9)
            ax.set_xlabel(f'start: top-1 drawn at {protocol.train_size} px (%)')
            ax.set_ylabel('points')
            ax.grid(alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc='center left', bbox_to_anchor=(1, 0.5), fontsize=8)
    fig.suptitle(f'{document["meta"]["name"]}: one point per check (every epoch), mean over seeds; the final '
                 'epoch ringed', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def write_outputs(results: dict[str, list[dict]], protocol: Protocol, pilot: bool, out: Path, meta: dict,
                  root: Path | None = None) -> dict:
    """The study's report (NAME.json, .md, .csv and a figure per candidate) from ``results`` ({candidate or '':
    runs}), rendered only from a clean tree at ``root`` (``common.committed``; the rendering commit is recorded
    apart from the runs'), from runs on one accelerator under this protocol."""
    rendered_at, _ = committed(root, 'render a report')
    runs = [r for rs in results.values() for r in rs]
    other = sorted({f'{r["variant"]} seed {r["seed"]}' for r in runs if r['protocol_sha256'] != protocol.sha256})
    if other:
        raise SystemExit(f'[{TAG}] runs of another protocol than {protocol.path}: {", ".join(other)}')
    devices = sorted({r['accelerator'] for r in runs})
    if len(devices) != 1:
        raise SystemExit(f'[{TAG}] the runs trained on more than one accelerator ({devices}): a comparison is made on '
                         'one')
    arms = protocol['pilot']['arms'] if pilot else protocol.arms
    summaries = {c: summarise(rs, protocol, arms) for c, rs in results.items()}
    d = protocol['data']
    meta = dict(meta, protocol=runs[0]['protocol'], protocol_sha256=protocol.sha256, status=protocol.status,
                pilot=pilot, name=protocol['pilot']['name'] if pilot else protocol['name'], arms=list(arms),
                seeds=sorted({r['seed'] for r in runs}), accelerator=devices[0],
                torch=sorted({r['torch'] for r in runs}), run_commits=sorted({r['commit'] for r in runs}),
                rendered_at=rendered_at, iterations=sorted({r['iterations'] for r in runs}),
                params={r['variant']: r['params'] for r in runs}, train_fields=d['train_fields'],
                train_set=d['scene_sets']['train'], validation_set=d['scene_sets']['validation'],
                validation_images=d['validation_images'], test_images=d['test_images'],
                test_set=d['scene_sets']['pilot_test' if pilot else 'test'],
                train_minutes=round(sum(r['train_seconds'] for r in runs) / 60, 1),
                check_minutes=round(sum(r['eval_seconds'] for r in runs) / 60, 1))
    meta['run_minutes'] = round(meta['train_minutes'] + meta['check_minutes'], 1)
    document = dict(meta=meta, protocol=protocol.data, summaries=summaries, runs=runs)
    if pilot:
        document['choice'] = pilot_choice(summaries)
    rows = [dict(candidate=c, arm=r['arm'], size=r['size'], native=r['native'][0], upsampled=r['upsampled'][0],
                 detail=format_paired(r['detail']), scale=format_paired(r['scale']), change=format_paired(r['change']))
            for c, s in summaries.items() for r in s['rows']]
    figures = {(f'_{c}' if pilot else ''): (lambda path, c=c: plot(document, protocol, path, c)) for c in summaries}
    write_report(out, meta['name'], document, render_markdown(document, protocol), rows, figures)
    return document


# -- the command line -------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--protocol', type=Path, default=PROTOCOL, help='the protocol file the study runs from')
    p.add_argument('--pilot', action='store_true',
                   help='run the protocol\'s pilot (its arms, candidate recipes and seeds >= 100; a draft will do)')
    p.add_argument('--scales', action='store_true',
                   help='print the object sizes of training crops and tests (no training) and exit')
    p.add_argument('--shard', default='0/1', help='K/N: run every N-th run from the K-th (0-based)')
    add_run_options(p, ROOT)
    args = p.parse_args(argv)
    args.shard_index, args.num_shards = parse_shard(p, args.shard)
    if args.jobs < 1 or args.threads < 1:
        p.error(f'--jobs and --threads must be >= 1, got {args.jobs} and {args.threads}')
    return args


def _run_shared(data, arm: str, seed: int, config: StudyConfig, protocol: Protocol, origin: dict,
                candidate: str | None) -> str:
    run(arm, seed, config, data, protocol, origin, candidate)
    return f'{arm}-seed{seed}'


def main(argv: Sequence[str] | None = None) -> dict:
    """Train and test this shard's runs, then (once every run is done) write the study's outputs."""
    args = parse_args(argv)
    protocol = Protocol.load(args.protocol)
    if args.scales:
        scales = object_scales(protocol, pilot=args.pilot)
        print(scales_text(scales))
        return scales
    start = time.perf_counter()
    pilot = args.pilot
    candidates = list(protocol['pilot']['recipes']) if pilot else [None]
    fields = dict(device=args.device, tf32=args.tf32, work_dir=args.work_dir, out=args.out)
    configs = {c: study_config(protocol, pilot, c, **fields) for c in candidates}
    first = next(iter(configs.values()))
    check_may_run(protocol, first.seeds)
    study_dir = args.work_dir / first.name
    check_study_protocol(study_dir, protocol)
    keys = [(c, arm, seed) for c in candidates for seed in first.seeds for arm in first.variants]
    grid = Grid(keys, lambda k: [configs[k[0]].run_dir(k[1], k[2])], args.shard_index, args.num_shards)
    todo = grid.todo()
    if todo:
        origin = provenance(args.device)   # refuses uncommitted code before anything is drawn
        with drawing_pool(args.jobs) as pool:
            data = load_data(protocol, pilot, pool)
        if args.jobs > 1:
            calls = [(arm, seed, configs[c], protocol, origin, c) for c, arm, seed in todo]
            for done in map_shared(_run_shared, calls, data, args.jobs, args.threads, 'confirm_detail-'):
                print(f'[{TAG}] {done} finished', flush=True)
        for c, arm, seed in todo:
            run(arm, seed, configs[c], data, protocol, origin, c)
    if not grid.complete(TAG):
        return {}
    results: dict = {}
    for c, arm, seed in keys:
        results.setdefault(c or '', []).append(run(arm, seed, configs[c], None, protocol))
    meta = dict(run_meta('benchmarks.confirm_detail', argv, start), object_scales=object_scales(protocol, pilot=pilot))
    document = write_outputs(results, protocol, pilot, args.out, meta)
    print(f'[{TAG}] {document["meta"]["wall_minutes"]} min; results in {args.out}')
    return document


if __name__ == '__main__':
    main()
