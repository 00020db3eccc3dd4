"""The powered study preregistered in benchmarks/protocols/powered_detail.json: its plan recomputed from the
confirmatory study's stored runs (benchmarks/confirm_detail/decision.py), its decision rules, the control's pilot
choice, malformed protocols refused, and a tiny study of its kind end to end (the final epoch alone, each scene's
true-class log-probability kept, the narrowed control fixed by its pilot)."""
import copy
import hashlib
import io
import json
import statistics

import numpy as np
import pytest
import torch

from benchmarks.confirm_detail import analysis, cli, decision, design, render
from benchmarks.confirm_detail import protocol as proto
from benchmarks.study.summary import RESULTS, load

POWERED = proto.ROOT / 'benchmarks' / 'protocols' / 'powered_detail.json'
ORIGIN = dict(accelerator='test CPU', torch=torch.__version__, commit='0' * 40, commit_from='git', source_digest='d')


# -- the powered protocol ------------------------------------------------------------------------------------------


def test_the_powered_protocol_is_planned_from_the_confirmatory_runs_before_any_of_its_own():
    powered, confirm = proto.Protocol.load(POWERED), proto.Protocol.load(proto.PROTOCOL)
    assert powered.status == 'draft' and powered.arms == ('learned', 'peg_0-5', 'cnn')
    assert powered['seeds'] == list(range(200, 216)) and all(s in proto.PILOT_SEEDS for s in powered['pilot']['seeds'])
    assert not set(powered['seeds']) & {*confirm['seeds'], *confirm['pilot']['seeds']}
    earlier = powered['earlier_studies'][0]
    assert earlier['protocol_sha256'] == confirm.sha256 and earlier['seeds'] == confirm['seeds']
    used = {*powered['data']['earlier_scene_sets']}
    assert {*confirm['data']['scene_sets'].values(), *confirm['data']['earlier_scene_sets']} == used
    assert not set(powered['data']['scene_sets'].values()) & used
    assert powered['recipe'] == confirm['recipe'] and powered['crops'] == confirm['crops']   # the recipe unchanged
    assert powered['blur_up'] == confirm['blur_up'] and powered.sizes == confirm.sizes
    assert powered['data']['test_images'] == 5000 and powered.checks_per_epoch == 0
    assert powered['tests']['log_probabilities'] is True
    assert powered['analysis']['family'] == [powered['decision']['contrast']] == ['detail68:peg-learned']
    # the plan it records is what decision.plan computes from the stored confirmatory runs
    plan = decision.plan(load('confirm_detail')['runs'], confirm, len(powered['seeds']), 5000)
    assert {k: v for k, v in powered['plan'].items() if k not in ('method', 'command')} == plan
    assert plan['sd'] == dict(observed=2.74, projected=2.15) and plan['test_share'] == 0.48
    assert plan['power'] == dict(observed=dict(superiority=0.69, equivalence=0.745),
                                 projected=dict(superiority=0.878, equivalence=0.942))
    power = powered['decision']['power']
    assert (power['superiority'], power['equivalence'], power['effect']) == (0.878, 0.942, 1.8)
    assert powered.control == dict(arm='cnn', target=plan['target'], within=5.0) and plan['target'] == 68.2
    start = [r['checks'][-1]['final']['native40'] for r in load('confirm_detail')['runs']
             if r['variant'] in ('peg_0-5', 'learned')]
    assert round(statistics.mean(start), 1) == 68.2
    assert plan['cpu_hours'] == round(16 * sum(plan['minutes'].values()) / 60, 1)
    # no confirmatory run before it is fixed; none has started
    with pytest.raises(SystemExit, match=r'is a draft: confirmatory seeds \[200\]'):
        proto.check_may_run(powered, [200])
    assert not (RESULTS / 'recipe_runs' / powered['name']).exists()
    for candidate in powered['pilot']['recipes']:   # the transformers train as in confirm_detail under every one
        for arm in ('learned', 'peg_0-5'):
            assert powered.arm_recipe(arm, candidate) == {}
    assert powered.arm_recipe('cnn', 'w8') == dict(dim=8)
    assert powered.arm_recipe('cnn', 'e12') == dict(epochs=12)


def test_the_primary_contrast_is_decided_by_the_rules_the_protocol_states():
    rule = proto.Protocol.load(POWERED)['decision']
    verdicts = {name: decision.decide(values, rule)['verdict'] for name, values in dict(
        superior=[3., 4., 2.5, 5., 3.5, 4.], within=[0.3, -0.2, 0.5, 0.1, -0.4, 0.2], both=[1.2, 1., 1.4, 0.9, 1.1],
        inferior=[-3., -4., -2.5, -5., -3.5], undecided=[3., -2., 4., -1., 2.5]).items()}
    assert verdicts == dict(superior='superiority', within='equivalence', both='superiority, within the margin',
                            inferior='inferiority', undecided='undecided')
    assert set(verdicts.values()) <= set(decision.VERDICTS)
    d = decision.decide([1., 2., 3.], rule)
    assert d['wide']['lo'] < d['narrow']['lo'] < d['narrow']['hi'] < d['wide']['hi']
    assert decision.decide([1.], rule)['verdict'] == 'undecided'


def test_the_pilot_fixes_the_control_nearest_its_target_clear_of_the_ceiling():
    def summary(distance, clear=True, within=5.):
        return dict(control=dict(distance=distance, holds=abs(distance) <= within),
                    ceiling=dict(tops={'cnn': 80.}, clear=clear))
    assert analysis.pilot_choice(dict(a=summary(20.), b=summary(-3.), c=summary(4.))) == dict(
        candidate='b', holds=True, distances=dict(a=20., b=-3., c=4.), clear=dict(a=True, b=True, c=True))
    assert analysis.pilot_choice(dict(a=summary(1., clear=False), b=summary(9.)))['candidate'] == 'b'
    choice = analysis.pilot_choice(dict(a=summary(1., clear=False), b=summary(2., clear=False)))
    assert choice['candidate'] == 'a' and choice['holds'] is False
    assert analysis.pilot_choice(dict(a=summary(8.), b=summary(-7.)))['holds'] is False


@pytest.mark.parametrize('change, message', [
    (lambda d: d['pilot'].update(seeds=[200]), "pilot's seeds must lie in 100..199"),
    (lambda d: d.update(seeds=[200, 150]), "outside the pilots' 100..199"),
    (lambda d: d.update(seeds=[200, 200]), 'must be distinct'),
    (lambda d: d['analysis'].update(family=['nope']), 'analysis.family'),
    (lambda d: d['decision'].update(contrast='nope'), "decision: names contrast 'nope'"),
    (lambda d: d['decision']['equivalence'].update(margin=0), 'equivalence.margin be > 0'),
    (lambda d: d['control'].update(arm='learned'), 'control: its arm must be a CNN arm of the pilot'),
    (lambda d: d['control'].pop('within'), 'control needs exactly arm, target and within'),
    (lambda d: d['tests'].update(checks_per_epoch=2), 'the final epoch alone (0)'),
    (lambda d: d['tests'].update(log_probabilities='yes'), 'tests.log_probabilities'),
    (lambda d: d['recipe'].update(control_dim=8.), "recipe entries ['control_dim']"),
])
def test_a_malformed_powered_protocol_is_refused_naming_the_entry(tmp_path, change, message):
    from test_confirm_detail import refused_naming
    refused_naming(POWERED, change, message, tmp_path)


# -- a tiny study of its kind --------------------------------------------------------------------------------------


def _tiny(tmp_path, status='draft', **changes) -> str:
    """The powered protocol cut to seconds (64 fields at 80 px, 2 epochs of 2 steps, 12 test scenes), written to
    ``tmp_path``; ``changes`` replace top-level entries."""
    data = json.loads(POWERED.read_text())
    data.update(status=status, name='tinyp', seeds=[200, 201])
    data['recipe'].update(epochs=2, warmup_epochs=1, batch_size=32, dim=16, heads=2, stem_layers=1, object_scale=1.)
    data['pilot'] = dict(name='tinyp_pilot', seeds=[100], arms=['cnn'],
                         recipes={'w4': {'control_dim': 4}, 'e1': {'control_epochs': 1}})
    data['data'].update(train_fields=64, validation_images=16, test_images=12, field_px=80)
    data['crops']['min_area'] = 0.5
    data['tests']['check_images'] = 8
    data.update(changes)
    path = tmp_path / 'tinyp.json'
    path.write_text(json.dumps(data, indent=1))
    return str(path)


@pytest.fixture
def committed(monkeypatch):
    monkeypatch.setattr(cli, 'provenance', lambda device: dict(ORIGIN))
    monkeypatch.setattr(render, 'committed', lambda root=None, doing='': ('c' * 40, 'git'))


def _argv(tmp_path, protocol, *more):
    return ['--protocol', protocol, '--work-dir', str(tmp_path / 'runs'), '--out', str(tmp_path / 'out'), *more]


def test_a_tiny_powered_study_checks_its_final_epoch_alone_keeps_log_probabilities_and_decides(tmp_path, committed,
                                                                                               monkeypatch, capsys):
    draft = _tiny(tmp_path)
    document = cli.main(_argv(tmp_path, draft, '--pilot'))
    choice = document['choice']
    assert set(choice['distances']) == {'w4', 'e1'} and choice['candidate'] in ('w4', 'e1')
    assert '**The recipe the pilot fixes**' in (tmp_path / 'out' / 'tinyp_pilot.md').read_text()
    narrow, short = (json.loads((tmp_path / 'runs' / 'tinyp_pilot' / c / 'cnn-seed100' / 'result.json').read_text())
                     for c in ('w4', 'e1'))
    assert narrow['params'] < short['params'] and (narrow['epochs'], short['epochs']) == (2, 1)
    assert short['iterations'] * 2 == narrow['iterations']
    assert [c['epoch'] for c in narrow['checks']] == [2] and [c['epoch'] for c in short['checks']] == [1]

    recipe = {**json.loads((tmp_path / 'tinyp.json').read_text())['recipe'],
              **json.loads((tmp_path / 'tinyp.json').read_text())['pilot']['recipes']['w4']}
    fixed = _tiny(tmp_path, status='fixed', recipe=recipe)
    # a run cut during its final check resumes there without training again
    real, calls = design.correct, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(design, 'correct', failing)
    with pytest.raises(KeyboardInterrupt):
        cli.main(_argv(tmp_path, fixed, '--shard', '0/6'))   # learned seed 200
    monkeypatch.setattr(design, 'correct', real)
    document = cli.main(_argv(tmp_path, fixed))
    assert 'learned seed 200: resuming after epoch 2' in capsys.readouterr().out
    run_dir = tmp_path / 'runs' / 'tinyp' / 'learned-seed200'
    record = json.loads((run_dir / 'result.json').read_text())
    assert len(record['log']) == 2 and [c['epoch'] for c in record['checks']] == [2]
    check = record['checks'][0]
    assert set(check['final']) == set(check['tests']) and all(v * 8 % 100 == 0 for v in check['tests'].values())
    # every final test scene's true-class log-probability, in a file whose sha256 the record holds
    raw = (run_dir / design.LOG_PROBABILITIES).read_bytes()
    assert record['log_probabilities'] == dict(file=design.LOG_PROBABILITIES, scenes=12,
                                               sha256=hashlib.sha256(raw).hexdigest())
    scores = np.load(io.BytesIO(raw))
    assert set(scores.files) == set(check['final'])
    for key in scores.files:
        lp = scores[key]
        assert lp.shape == (12,) and lp.dtype == np.float32 and (lp <= 0).all()
        assert 100 * (np.exp(lp) > 0.5).mean() <= check['final'][key] + 1e-6   # above one half: classified right
    cnn = json.loads((tmp_path / 'runs' / 'tinyp' / 'cnn-seed201' / 'result.json').read_text())
    assert cnn['params'] == narrow['params']   # the control at its fixed width
    summary = document['summaries']['']
    assert summary['decision']['verdict'] in decision.VERDICTS and summary['hindsight'] is None
    assert [c['secondary'] for c in summary['contrasts'].values()] == [False, True, True]
    assert summary['contrasts']['change68:peg-learned']['holm_level'] == 0.95 and summary['learns'] is None
    text = (tmp_path / 'out' / 'tinyp.md').read_text()
    assert '**Primary contrast** (gain from detail at 68 px: peg_0-5 − learned; the rules fixed' in text
    assert 'Holm over detail68:peg-learned; the others secondary, unadjusted, no claim' in text
    assert 'Its planned power: superiority 88% were the true difference +1.8, equivalence 94% were it 0' in text
    assert '**The control at the transformers\' accuracy** (cnn\'s top-1 drawn at 40 px' in text
    sibling = copy.deepcopy(document['summaries'])
    monkeypatch.setattr(design, 'train', lambda *a, **k: pytest.fail('a finished run was trained again'))
    assert cli.main(_argv(tmp_path, fixed))['summaries'] == sibling
