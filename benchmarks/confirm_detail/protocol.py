"""The study's protocol file, read, checked and hashed (``Protocol``), and the guards that tie every run to it: no
confirmatory run under a draft (``check_may_run``), no study continued under another protocol
(``check_study_protocol``)."""
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.study import records
from benchmarks.study.config import VARIANTS

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / 'benchmarks/protocols/confirm_detail.json'
PILOT_SEEDS = range(100, 200)        # pilot seeds lie here; confirmatory seeds outside it (0..99 or 200 and up)
STATUSES = ('draft', 'fixed')
# The recipe's fields and their types; each sets the StudyConfig field of its name (warmup_epochs sets warmup, as
# its share of the epochs), but for those of TASK_FIELDS: object_scale, the factor on data.object_size that every
# scene a run sees is drawn with (training fields, validation and tests alike), and control_dim and control_epochs,
# the width and the epochs of the CNN control alone (``Protocol.arm_recipe``; the warm-up keeps its share). A recipe
# may leave out those of RECIPE_DEFAULTS, which then take the value given there, and the control's fields (the
# control then trains as every arm does).
RECIPE = dict(epochs=int, warmup_epochs=(int, float), batch_size=int, lr=float, weight_decay=float,
              drop_path=float, dim=int, depth=int, heads=int, patch=int, stem_layers=int, stem_norm=bool,
              object_scale=float, control_dim=int, control_epochs=int)
RECIPE_DEFAULTS = dict(stem_norm=False, object_scale=1.0)
CONTROL_FIELDS = dict(control_dim='dim', control_epochs='epochs')   # recipe field -> the control's StudyConfig field
TASK_FIELDS = ('warmup_epochs', 'object_scale', *CONTROL_FIELDS)   # recipe fields that set no field of their name
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
        """The protocol at ``path``, validated (``validate``); SystemExit where there is no file (the study runs only
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
            protocol.validate()
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

    @property
    def learns(self) -> dict | None:
        """The learning rule, its ``reference_min`` 0 where the file leaves it out (the first pilot's draft did);
        None where the file has none."""
        return {'reference_min': 0., **self.data['learns']} if 'learns' in self.data else None

    @property
    def control(self) -> dict | None:
        """The control rule (``control``: the control arm, the ``target`` top-1 at the training size its recipe is
        fixed to reach, and the points ``within`` which it holds), None where the file has none."""
        return self.data.get('control')

    @property
    def checks_per_epoch(self) -> int:
        """1: every epoch is checked; 0: the final epoch alone."""
        return self.data['tests']['checks_per_epoch']

    def arm_recipe(self, arm: str, candidate: str | None = None) -> dict:
        """The StudyConfig fields ``arm`` trains with beyond the study's: the CNN control's ``control_dim`` and
        ``control_epochs`` as its ``dim`` and ``epochs`` (the warm-up keeps its share of the epochs), for every
        other arm nothing."""
        if not VARIANTS[arm].cnn:
            return {}
        recipe = self.recipe(candidate)
        return {field: recipe[key] for key, field in CONTROL_FIELDS.items() if key in recipe}

    @property
    def ceiling(self) -> dict | None:
        """The ceiling rule (``ceiling``: its arms, size and the top-1 they stay below), None where the file has
        none (as in the earlier pilots' drafts)."""
        return self.data.get('ceiling')

    def object_size(self, candidate: str | None = None) -> tuple[float, float]:
        """The radii of the scenes' shapes (fractions of half the side): ``data.object_size`` times the recipe's
        ``object_scale``."""
        scale = self.recipe(candidate)['object_scale']
        return tuple(round(v * scale, 6) for v in self.data['data']['object_size'])

    def recipe(self, candidate: str | None = None) -> dict:
        """The recipe, with the pilot candidate ``candidate``'s changes where given."""
        return {**RECIPE_DEFAULTS, **self.data['recipe'],
                **(self.data['pilot']['recipes'][candidate] if candidate else {})}

    def validate(self) -> None:
        """ProtocolError naming the first entry the study cannot run: missing or unknown keys, arms, seeds on the
        wrong side of ``PILOT_SEEDS``, scene sets shared with each other or with earlier studies, sizes, a crop
        that would be upsampled, blur-up sizes other than the upsampled tests', contrasts, a Holm family, a
        decision or claims naming what does not exist, malformed learning, ceiling or control rules."""
        d = self.data
        keys = {'format', 'name', 'status', 'question', 'design', 'arms', 'seeds', 'recipe', 'pilot', 'data',
                'crops', 'blur_up', 'tests', 'analysis', 'claims'}
        _need(isinstance(d, dict) and not keys - set(d), f'{self.path}: needs the entries {sorted(keys)}; missing '
              f'{sorted(keys - set(d)) if isinstance(d, dict) else "all"}')
        extra = sorted(set(d) - keys - {'earlier_pilots', 'earlier_studies', 'recipe_rule', 'learns', 'ceiling',
                                        'control', 'decision', 'plan'})
        _need(not extra, f'{self.path}: unknown entries {extra}')
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
        pilots = f'{PILOT_SEEDS.start}..{PILOT_SEEDS.stop - 1}'
        _need(bool(seeds) and len(set(seeds)) == len(seeds)
              and all(isinstance(s, int) and s >= 0 and s not in PILOT_SEEDS for s in seeds),
              f'the confirmatory seeds must be distinct, >= 0 and outside the pilots\' {pilots}, got {seeds}')
        _need(bool(pilot_seeds) and all(isinstance(s, int) and s in PILOT_SEEDS for s in pilot_seeds),
              f'the pilot\'s seeds must lie in {pilots}, got {pilot_seeds}')
        for recipe in (d['recipe'], *d['pilot'].get('recipes', {}).values()):
            wrong = sorted(k for k, v in recipe.items() if k not in RECIPE or not isinstance(v, RECIPE[k])
                           or (isinstance(v, bool) and RECIPE[k] is not bool))
            _need(not wrong, f'recipe entries {wrong}: not one of {sorted(RECIPE)} with its type')
            scale = recipe.get('object_scale', RECIPE_DEFAULTS['object_scale'])
            _need(scale > 0 and max(d['data']['object_size']) * scale < 1,
                  f'object_scale must be > 0 and keep every radius below half the side, got {scale}')
        needed = sorted(set(RECIPE) - set(RECIPE_DEFAULTS) - set(CONTROL_FIELDS))
        _need(set(needed) <= set(d['recipe']), f'the recipe needs every entry of {needed}')
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
        _need(d['tests']['checks_per_epoch'] in (0, 1),
              'the study checks every epoch (tests.checks_per_epoch 1) or the final epoch alone (0)')
        _need(isinstance(d['tests'].get('log_probabilities', False), bool),
              'tests.log_probabilities (keep each final test scene\'s true-class log-probability) must be true or '
              'false')
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
        family = d['analysis'].get('family')
        _need(family is None or (bool(family) and set(family) <= set(ids)),
              f'analysis.family (the contrasts Holm corrects over) must name some of {ids}, got {family}')
        rule = d.get('decision')
        if rule is not None:
            _need(rule['contrast'] in ids, f'decision: names contrast {rule["contrast"]!r}; contrasts {ids}')
            sup, eq = rule['superiority'], rule['equivalence']
            _need(0 < sup['confidence'] < 1 and 0 < eq['confidence'] < 1 and eq['margin'] > 0,
                  'decision: superiority.confidence and equivalence.confidence must lie in (0, 1) and '
                  'equivalence.margin be > 0')
        for claim in d['claims']:
            _need(claim['contrast'] in ids and claim['direction'] in DIRECTIONS,
                  f'claim {claim["id"]}: names contrast {claim["contrast"]!r} and direction {claim["direction"]!r}; '
                  f'contrasts {ids}, directions {DIRECTIONS}')
        learns = d.get('learns')
        if learns is not None:
            _need(learns['reference'] in d['arms'] and set(learns['arms']) <= set(d['arms']),
                  'learns: its arms and reference must be arms')
            _need(0 <= learns.get('reference_min', 0) <= 100 and learns['within'] >= 0,
                  'learns: reference_min (validation top-1, %; optional) must lie in 0..100 and within be >= 0')
        control = d.get('control')
        if control is not None:
            _need(set(control) == {'arm', 'target', 'within'}, 'control needs exactly arm, target and within')
            _need(control['arm'] in d['pilot']['arms'] and VARIANTS[control['arm']].cnn,
                  'control: its arm must be a CNN arm of the pilot')
            _need(0 < control['target'] < 100 and control['within'] > 0,
                  'control: target (top-1, %) must lie in (0, 100) and within be > 0')
        ceiling = d.get('ceiling')
        if ceiling is not None:
            _need(set(ceiling) == {'arms', 'size', 'below'}, 'ceiling needs exactly arms, size and below')
            _need(bool(ceiling['arms']) and set(ceiling['arms']) <= set(d['pilot']['arms']),
                  'ceiling: its arms must be the pilot\'s arms')
            _need(ceiling['size'] in d['tests']['upsampled'] and 0 < ceiling['below'] <= 100,
                  'ceiling: size must be one of tests.upsampled and below (top-1, %) lie in (0, 100]')


def check_may_run(protocol: Protocol, seeds: Sequence[int]) -> None:
    """Refuses (SystemExit) confirmatory seeds (outside ``PILOT_SEEDS``) under a draft protocol: only pilots run
    before the protocol is fixed."""
    confirmatory = sorted(s for s in seeds if s not in PILOT_SEEDS)
    if confirmatory and protocol.status != 'fixed':
        raise SystemExit(f'[{TAG}] {protocol.path} is a {protocol.status}: confirmatory seeds {confirmatory} run only '
                         f'under a fixed protocol (pilot seeds lie in {PILOT_SEEDS.start}..{PILOT_SEEDS.stop - 1})')


def check_study_protocol(study_dir: Path, protocol: Protocol) -> None:
    """Refuses (SystemExit) to continue the study under ``study_dir`` where any of its runs (started_on.json or
    result.json) records another protocol hash than the file's: a changed protocol needs a new study name."""
    other = sorted({str(path.parent.relative_to(study_dir)) for name in ('started_on.json', 'result.json')
                    for path in study_dir.rglob(name)
                    if records.read(path).get('protocol_sha256') != protocol.sha256})
    if other:
        raise SystemExit(f'[{TAG}] runs of {study_dir.name} were started under another protocol than {protocol.path} '
                         f'(sha256 {protocol.sha256[:12]}): {", ".join(other[:6])}{" ..." if len(other) > 6 else ""}.'
                         ' A changed protocol needs a new study name (its name, or pilot.name)')
