"""The confirmatory native-detail study (benchmarks/confirm_detail/): its protocol refused or hashed, runs that
resume, the analysis (paired intervals, Holm's correction, the claims' verdicts) on synthetic records, a report
refused from a dirty tree, and a tiny study end to end; with the study library it adds (t distribution, Holm,
blur-up, warm-up, a deeper stem, the conv-MLP arm)."""
import copy
import hashlib
import json
import math
import re
import statistics
import subprocess

import numpy as np
import pytest
import torch

from benchmarks.confirm_detail import analysis, cli, decision, design, render
from benchmarks.confirm_detail import protocol as proto
from benchmarks.confirm_detail.spec import Confirm
from benchmarks.study import stats
from benchmarks.study.common import _T975, paired
from benchmarks.study.config import StudyConfig
from benchmarks.study.data import blur_up, resize
from benchmarks.study.records import STUDIED_CODE
from benchmarks.study.stem import ConvStem
from benchmarks.study.summary import RESULTS, load
from benchmarks.study.trainer import build_model, make_optimizer
from benchmarks.verdict import cli as verdict_cli
from cpvt_backbones.layers import ConvMlp

ORIGIN = dict(accelerator='test CPU', torch=torch.__version__, commit='0' * 40, commit_from='git', source_digest='d')
ARMS = ['none', 'peg_0-5', 'conv_mlp', 'cnn']


def tiny(tmp_path, status='draft', name='tiny', **changes) -> str:
    """The study's protocol cut to seconds (64 fields at 80 px, 2 epochs of 2 steps, 12 test scenes), written to
    ``tmp_path``; ``changes`` replace top-level entries."""
    data = json.loads(proto.PROTOCOL.read_text())
    data.update(status=status, name=name, arms=ARMS, seeds=[0, 1])
    data['recipe'].update(epochs=2, warmup_epochs=1, batch_size=32, dim=16, heads=2, stem_layers=1, object_scale=1.)
    data['pilot'] = dict(name=f'{name}_pilot', seeds=[100], arms=['none', 'peg_0-5'],
                         recipes={'a': {}, 'b': {'stem_layers': 0, 'stem_norm': True, 'object_scale': 0.5}})
    data['data'].update(train_fields=64, validation_images=16, test_images=12, field_px=80)
    data['crops']['min_area'] = 0.5
    data['tests']['check_images'] = 8
    data['analysis']['contrasts'] = [c for c in data['analysis']['contrasts']
                                     if c['a'] in ARMS and c.get('b', c['a']) in ARMS]
    ids = {c['id'] for c in data['analysis']['contrasts']}
    data['claims'] = [c for c in data['claims'] if c['contrast'] in ids]
    data['learns'] = dict(arms=['none'], reference='peg_0-5', within=3.0)
    data['ceiling'] = dict(arms=['peg_0-5'], size=68, below=95.0)
    data.update(changes)
    path = tmp_path / f'{name}.json'
    path.write_text(json.dumps(data, indent=1))
    return str(path)


@pytest.fixture
def committed(monkeypatch):
    """Provenance and the rendering commit as a clean commit would give them (the suite may run in a tree being
    edited)."""
    monkeypatch.setattr(cli, 'provenance', lambda device: dict(ORIGIN))
    monkeypatch.setattr(render, 'committed', lambda root=None, doing='': ('c' * 40, 'git'))


def _argv(tmp_path, protocol, *more):
    return ['--protocol', protocol, '--work-dir', str(tmp_path / 'runs'), '--out', str(tmp_path / 'out'), *more]


# -- the protocol --------------------------------------------------------------------------------------------------


def test_the_committed_protocol_parses_and_centres_its_crops_on_the_1x_test():
    protocol = proto.Protocol.load(proto.PROTOCOL)
    assert protocol.sha256 == hashlib.sha256(proto.PROTOCOL.read_bytes()).hexdigest()
    assert protocol.arms == ('learned', 'none', 'peg_0-5', 'peg_0-5_circular', 'conv_mlp', 'cnn')
    assert protocol['seeds'] == [0, 1, 2, 3, 4] and all(s in proto.PILOT_SEEDS for s in protocol['pilot']['seeds'])
    assert not set(protocol['data']['scene_sets'].values()) & set(range(5))   # none of the earlier studies' sets
    config = design.study_config(protocol, pilot=False)
    assert config.blur_up == protocol['blur_up']['share'] and config.stem and config.head == 'gap'
    assert config.warmup * config.epochs == pytest.approx(protocol['recipe']['warmup_epochs'])
    # the crops' object sizes centred on the 1x test's (fewer fields and crops than the study measures)
    small = proto.Protocol(copy.deepcopy(protocol.data), protocol.path, protocol.sha256)
    small.data['data']['train_fields'] = 800
    scales = design.object_scales(small, crops=5000)
    below = {k: t['crop_share_below'] for k, t in scales['tests'].items()}
    first, last = (f'native{s}' for s in (protocol.train_size, protocol.sizes[-1]))
    assert 0.42 < below[first] < 0.58 and below[last] > 0.9, below   # measured: 0.52 and 0.98
    assert scales['empty_crops'] < 0.05
    assert 'share of crop objects smaller than its median' in render.scales_text(scales)


def test_the_earlier_pilots_protocols_still_load_and_a_recipe_may_leave_out_the_stem_norm_and_object_scale():
    earlier_pilots = proto.Protocol.load(proto.PROTOCOL)['earlier_pilots']
    assert sum('stem_norm' not in json.loads((proto.ROOT / e['protocol']).read_text())['recipe']
               for e in earlier_pilots) == 3   # the first three pilots' drafts had none
    unscaled = 0
    for earlier in earlier_pilots:
        kept = proto.Protocol.load(proto.ROOT / earlier['protocol'])
        assert kept.sha256 == earlier['protocol_sha256'] and kept['pilot']['name'] == earlier['name']
        assert 'object_scale' not in kept['recipe'] and kept.recipe()['stem_norm'] is False
        for candidate, changes in kept['pilot']['recipes'].items():
            config = design.study_config(kept, pilot=True, candidate=candidate)
            assert config.stem_norm is changes.get('stem_norm', False)
            scale = changes.get('object_scale', 1.)
            assert kept.object_size(candidate) == pytest.approx([v * scale for v in kept['data']['object_size']])
        if 'ceiling' not in kept.data:
            # nor an object scale: their objects as drawn then, no ceiling rule
            unscaled += 1
            assert all('object_scale' not in changes for changes in kept['pilot']['recipes'].values())
            assert kept.ceiling is None and analysis.ceiling([], kept) is None
    assert unscaled == 4   # the first four pilots' drafts had neither
    protocol = proto.Protocol.load(proto.PROTOCOL)
    for candidate, changes in protocol['pilot']['recipes'].items():
        config = design.study_config(protocol, pilot=True, candidate=candidate)
        assert config.stem_norm == changes.get('stem_norm', protocol['recipe']['stem_norm'])
        scale = changes.get('object_scale', 1.)
        assert protocol.object_size(candidate) == pytest.approx([v * scale for v in protocol['data']['object_size']])


def test_the_object_scale_sizes_every_scene_a_run_sees():
    protocol = proto.Protocol.load(proto.PROTOCOL)
    data = copy.deepcopy(protocol.data)
    data['data']['train_fields'] = 40
    data['pilot']['recipes'] = dict(whole={'object_scale': 1.}, half={'object_scale': 0.5})
    small = proto.Protocol(data, protocol.path, protocol.sha256)
    lo, hi = data['data']['object_size']
    for candidate, scale in (('whole', 1.), ('half', 0.5)):
        held, _ = design.held_out_scenes(small, 'validation', 50, candidate)
        radii = [sh.r / (data['data']['test_side'] / 2) for scene in held for sh in scene.shapes]
        assert lo * scale - 1e-9 <= min(radii) and max(radii) <= hi * scale + 1e-9 and max(radii) > hi * scale * 0.9
        fields, _ = design.field_scenes(small, candidate)   # the fields' shapes as large as the tests' in units
        radii = [sh.r / (data['data']['test_side'] / 2) for scene in fields for sh in scene.shapes]
        assert max(radii) <= hi * scale + 1e-3 and max(radii) > hi * scale * 0.9
    assert not hasattr(design.study_config(small, pilot=True, candidate='half'), 'object_scale')


@pytest.mark.parametrize('change, message', [
    (lambda d: d['data']['scene_sets'].update(test=3), 'earlier studies'),
    (lambda d: d['data']['scene_sets'].update(test=10), 'distinct'),
    (lambda d: d['pilot'].update(seeds=[4]), 'pilot\'s seeds must lie in 100..199'),
    (lambda d: d.update(seeds=[0, 100]), 'outside the pilots\' 100..199'),
    (lambda d: d.update(arms=['none', 'nope']), "unknown arm(s) ['nope']"),
    (lambda d: d['recipe'].update(lr='fast'), "recipe entries ['lr']"),
    (lambda d: d['recipe'].update(stem_norm=1), "recipe entries ['stem_norm']"),
    (lambda d: d['pilot']['recipes'].update(x={'stem_layers': True}), "recipe entries ['stem_layers']"),
    (lambda d: d['recipe'].pop('stem_layers'), "the recipe needs every entry of"),
    (lambda d: d['blur_up'].update(sizes=[96]), 'blur_up draws crops'),
    (lambda d: d['crops'].update(min_area=0.1), 'would be upsampled'),
    (lambda d: d['claims'][0].update(contrast='nope'), 'names contrast'),
    (lambda d: d['analysis']['contrasts'][0].update(size=64), 'size must be one of tests.upsampled'),
    (lambda d: d.update(status='final'), 'status must be one of'),
    (lambda d: d.update(notes='x'), "unknown entries ['notes']"),
    (lambda d: d['recipe'].update(object_scale=1), "recipe entries ['object_scale']"),
    (lambda d: d['pilot']['recipes'].update(x={'object_scale': 0.}), 'object_scale must be > 0'),
    (lambda d: d['pilot']['recipes'].update(x={'object_scale': 3.5}), 'below half the side'),
    (lambda d: d['ceiling'].update(arms=['conv_mlp']), 'ceiling: its arms must be the pilot'),
    (lambda d: d['ceiling'].update(size=40), 'ceiling: size must be one of tests.upsampled'),
    (lambda d: d['ceiling'].update(below=0), 'below (top-1, %) lie in'),
    (lambda d: d['ceiling'].pop('below'), 'ceiling needs exactly arms, size and below'),
])
def test_a_malformed_protocol_is_refused_naming_the_entry(tmp_path, change, message):
    refused_naming(proto.PROTOCOL, change, message, tmp_path)


def refused_naming(protocol, change, message: str, folder) -> None:
    """The protocol file ``protocol`` with ``change`` applied to its data is refused with ``message``."""
    data = json.loads(protocol.read_text())
    change(data)
    path = folder / 'p.json'
    path.write_text(json.dumps(data))
    with pytest.raises(proto.ProtocolError, match=re.escape(message)):
        proto.Protocol.load(path)


def test_no_protocol_no_confirmatory_run_under_a_draft_and_no_continuing_under_another(tmp_path, committed, capsys):
    with pytest.raises(SystemExit, match='no protocol at'):
        cli.main(_argv(tmp_path, str(tmp_path / 'missing.json')))
    draft = tiny(tmp_path)
    with pytest.raises(SystemExit, match=r'is a draft: confirmatory seeds \[0, 1\] run only under a fixed protocol'):
        cli.main(_argv(tmp_path, draft))
    assert not (tmp_path / 'runs' / 'tiny').exists()          # refused before anything started
    with pytest.raises(SystemExit, match='a fixed protocol'):    # and a run refuses on its own
        protocol = proto.Protocol.load(draft)
        design.run('none', 0, design.study_config(protocol, False), None, protocol, dict(ORIGIN))
    # a pilot runs under the draft; each record holds the file's hash
    cli.main(_argv(tmp_path, draft, '--pilot', '--shard', '0/4'))
    started = json.loads((tmp_path / 'runs' / 'tiny_pilot' / 'a' / 'none-seed100' / 'result.json').read_text())
    sha = hashlib.sha256((tmp_path / 'tiny.json').read_bytes()).hexdigest()
    assert started['protocol_sha256'] == sha and started['pilot'] and started['candidate'] == 'a'
    assert started['scene_sets'] == dict(train=10, validation=11, test=13) and started['commit'] == '0' * 40
    # the protocol changed: the pilot's study refuses to go on under the same name
    changed = json.loads((tmp_path / 'tiny.json').read_text())
    changed['question'] += ' (edited)'
    (tmp_path / 'tiny.json').write_text(json.dumps(changed))
    with pytest.raises(SystemExit, match='A changed protocol needs a new study name'):
        cli.main(_argv(tmp_path, draft, '--pilot', '--shard', '1/4'))


# -- runs ----------------------------------------------------------------------------------------------------------


def test_a_run_interrupted_after_an_epoch_resumes_to_the_same_record(tmp_path, committed, monkeypatch, capsys):
    protocol = tiny(tmp_path, status='fixed')
    argv = ['--protocol', protocol, '--out', str(tmp_path / 'out'), '--shard', '3/4']   # cnn seed 0
    cli.main(argv + ['--work-dir', str(tmp_path / 'whole')])
    calls = []
    real = design.correct

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > 8:   # the first check validates and runs 7 tests; the second check stops the run
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(design, 'correct', failing)
    with pytest.raises(KeyboardInterrupt):
        cli.main(argv + ['--work-dir', str(tmp_path / 'cut')])
    monkeypatch.setattr(design, 'correct', real)
    cli.main(argv + ['--work-dir', str(tmp_path / 'cut')])
    assert 'cnn seed 0: resuming after epoch 1' in capsys.readouterr().out
    whole, cut = (json.loads((tmp_path / d / 'tiny' / 'cnn-seed0' / 'result.json').read_text())
                  for d in ('whole', 'cut'))
    assert [c['check'] for c in cut['checks']] == [1, 2] and 'final' in cut['checks'][-1]
    assert [{k: c[k] for k in ('val', 'tests')} for c in cut['checks']] == \
        [{k: c[k] for k in ('val', 'tests')} for c in whole['checks']]
    assert [e['loss'] for e in cut['log']] == [e['loss'] for e in whole['log']]
    assert cut['checks'][-1]['final'] == whole['checks'][-1]['final']


def test_a_tiny_pilot_and_confirmatory_study_end_to_end(tmp_path, committed, monkeypatch):
    draft = tiny(tmp_path)
    seen, real = {}, cli.run

    def run(arm, seed, config, data, protocol, origin=None, candidate=None):
        if origin is not None:   # training: the validation images it was handed
            seen.setdefault(candidate, data[1][0])
        return real(arm, seed, config, data, protocol, origin, candidate)
    monkeypatch.setattr(cli, 'run', run)
    document = cli.main(_argv(tmp_path, draft, '--pilot'))
    protocol = proto.Protocol.load(draft)   # each candidate's runs see the scenes drawn at its object size
    assert all(torch.equal(seen[c], design.load_data(protocol, True, None, c)[1][0]) for c in 'ab')
    assert not torch.equal(seen['a'], seen['b'])
    assert set(document['summaries']) == {'a', 'b'} and document['choice']['candidate'] in ('a', 'b')
    pilot_md = (tmp_path / 'out' / 'tiny_pilot.md').read_text()
    assert 'The recipe the pilot fixes' in pilot_md and '### Candidate `b`: ' in pilot_md
    assert 'Clear of the ceiling** (peg_0-5 below 95 at 68 px' in pilot_md
    assert render._flags(dict(learns=dict(reference_learns=False, reference='peg_0-5', reference_min=60.)),
                         False) == ' (peg_0-5 short of 60, at the ceiling)'
    assert render._flags(dict(learns=dict(reference_learns=True)), True) == ''
    assert (tmp_path / 'out' / 'tiny_pilot_a.png').stat().st_size > 0
    runs = tmp_path / 'runs' / 'tiny_pilot' / 'b' / 'peg_0-5-seed100'
    record = json.loads((runs / 'result.json').read_text())
    whole = proto.Protocol.load(draft)['data']['object_size']   # candidate b's objects drawn at half the size
    assert record['object_size'] == pytest.approx([v / 2 for v in whole])
    scales = document['meta']['object_scales']
    assert scales['b']['tests']['native40']['percentiles'][2] == pytest.approx(
        scales['a']['tests']['native40']['percentiles'][2] / 2, rel=0.2)
    assert [c['epoch'] for c in record['checks']] == [1, 2] and record['epochs'] == 2
    sizes = proto.Protocol.load(draft)
    assert set(record['checks'][0]['tests']) == ({f'native{s}' for s in sizes.sizes}
                                                 | {f'upsampled{s}' for s in sizes.upsampled})
    assert 'final' not in record['checks'][0] and set(record['checks'][1]['final']) == set(record['checks'][0]['tests'])
    assert all(v * 8 % 100 == 0 for v in record['checks'][0]['tests'].values())   # the first 8 test scenes
    assert all(round(v * 12) % 100 == 0 for v in record['checks'][1]['final'].values())   # all 12

    # fixed as the rule fixes it: candidate b's changes written into the recipe
    recipe = {**protocol['recipe'], **protocol['pilot']['recipes']['b']}
    fixed = tiny(tmp_path, status='fixed', recipe=recipe)
    document = cli.main(_argv(tmp_path, fixed))
    record = json.loads((tmp_path / 'runs' / 'tiny' / 'peg_0-5-seed1' / 'result.json').read_text())
    assert record['object_size'] == pytest.approx([v / 2 for v in whole]) and record['protocol'] == fixed
    summary = document['summaries']['']
    assert [r['seed'] for r in document['runs'] if r['variant'] == 'none'] == [0, 1]
    assert {(r['arm'], r['size']) for r in summary['rows']} == {(a, s) for a in ARMS for s in sizes.upsampled}
    assert set(summary['contrasts']) == {c['id'] for c in json.loads((tmp_path / 'tiny.json').read_text())
                                         ['analysis']['contrasts']}
    assert all(len(points) == 2 for points in summary['curves'].values())
    meta = document['meta']
    assert meta['rendered_at'] == 'c' * 40 and meta['run_commits'] == ['0' * 40] and meta['status'] == 'fixed'
    text = (tmp_path / 'out' / 'tiny.md').read_text()
    assert 'Holm over these' in text and 'Apparent object radius' in text and 'rendered at commit cccccccccc' in text
    assert (tmp_path / 'out' / 'tiny.png').stat().st_size > 0 and (tmp_path / 'out' / 'tiny.csv').is_file()
    # a second invocation trains nothing again
    monkeypatch.setattr(design, 'train', lambda *a, **k: pytest.fail('a finished run was trained again'))
    assert cli.main(_argv(tmp_path, fixed))['summaries'] == document['summaries']


# -- the analysis --------------------------------------------------------------------------------------------------


def _record(arm, seed, start, detail, scale, val=80.):
    """A finished run whose final check has the given start and, at every upsampled size, the given gains."""
    tests = {'native56': start}
    for s in (80, 96, 112):
        tests[f'upsampled{s}'] = start + scale
        tests[f'native{s}'] = start + scale + detail
    check = dict(check=2, epoch=2, val=val, tests=tests, final=tests)
    return dict(variant=arm, seed=seed, epochs=2, checks=[dict(check=1, epoch=1, val=val - 10, tests=tests), check],
                log=[dict(train_top1=70.), dict(train_top1=75.)], accelerator='test CPU', torch='2', commit='a' * 40,
                iterations=4, params=10, train_seconds=6., eval_seconds=3.)


PEG_DETAIL, TABLE_DETAIL, CNN_DETAIL = [10., 12., 11., 9., 13.], [0.5, -0.5, 1., 0., -1.], [1., 3., -2., 4., 0.]


def _synthetic(protocol):
    return ([_record('peg_0-5', s, 80. + s, d, 2.) for s, d in enumerate(PEG_DETAIL)]
            + [_record('learned', s, 78. + s, d, 1., val=79.) for s, d in enumerate(TABLE_DETAIL)]
            + [_record('cnn', s, 90., d, 0., val=95.) for s, d in enumerate(CNN_DETAIL)])


def _synthetic_protocol(tmp_path):
    data = json.loads(proto.PROTOCOL.read_text())   # at the sizes the synthetic records give
    data['crops']['size'], data['data']['field_px'] = 56, 126
    data['tests'].update(native=[56, 80, 96, 112], upsampled=[80, 96, 112])
    data['blur_up']['sizes'] = [80, 96, 112]
    data['analysis']['contrasts'] = [
        dict(id='peg', measure='detail', a='peg_0-5', size=96),
        dict(id='table', measure='detail', a='learned', size=96),
        dict(id='peg-table', measure='detail', a='peg_0-5', b='learned', size=96),
        dict(id='cnn', measure='detail', a='cnn', size=96),
        dict(id='start', measure='start', a='peg_0-5', b='learned')]
    data['claims'] = [dict(id='p', contrast='peg', direction='+', text='PEG gains.'),
                      dict(id='t', contrast='table', direction='+', text='The table gains.'),
                      dict(id='pt', contrast='peg-table', direction='-', text='The table gains more.'),
                      dict(id='s', contrast='start', direction='either', text='They start apart.')]
    data['learns'] = dict(arms=['learned'], reference='peg_0-5', within=3.0)
    data['ceiling'] = dict(arms=['peg_0-5'], size=96, below=95.0)
    data['arms'], data['pilot']['arms'] = ['learned', 'peg_0-5', 'cnn'], ['learned', 'peg_0-5']
    path = tmp_path / 'synthetic.json'
    path.write_text(json.dumps(data))
    return proto.Protocol.load(path)


def test_the_final_epoch_analysis_pairs_by_seed_and_holm_corrects_the_named_contrasts(tmp_path):
    protocol = _synthetic_protocol(tmp_path)
    summary = analysis.summarise(_synthetic(protocol), protocol, ['learned', 'peg_0-5', 'cnn'])
    peg96 = next(r for r in summary['rows'] if (r['arm'], r['size']) == ('peg_0-5', 96))
    assert peg96['native'] == (round(82 + sum(PEG_DETAIL) / 5 + 2, 2), peg96['native'][1])
    expected = paired([82 + s + d for s, d in enumerate(PEG_DETAIL)], [82. + s for s in range(5)])
    assert {k: peg96['detail'][k] for k in ('mean', 'lo', 'hi')} == {k: expected[k] for k in ('mean', 'lo', 'hi')}
    assert peg96['scale']['mean'] == 2. and peg96['change']['mean'] == round(2 + sum(PEG_DETAIL) / 5, 2)
    c = summary['contrasts']
    assert c['peg-table']['per_seed'] == [a - b for a, b in zip(PEG_DETAIL, TABLE_DETAIL, strict=True)]
    assert c['start']['per_seed'] == [2.] * 5 and c['start']['p'] == 0.   # a constant, non-zero difference
    # Holm by hand: p sorted, the j-th (from 0) of m = 5 tested at 0.05 / (5 - j) while all before are rejected
    tests = {'peg': stats.paired_test(PEG_DETAIL, [0.] * 5), 'table': stats.paired_test(TABLE_DETAIL, [0.] * 5),
             'peg-table': stats.paired_test(PEG_DETAIL, TABLE_DETAIL), 'cnn': stats.paired_test(CNN_DETAIL, [0.] * 5),
             'start': stats.paired_test([2.] * 5, [0.] * 5)}
    order = sorted(tests, key=lambda k: tests[k]['p'])
    assert order[:3] == ['start', 'peg', 'peg-table'] and order[-1] == 'table'
    step = [0.05 / 5, 0.05 / 4, 0.05 / 3, 0.05 / 2, 0.05 / 2]   # cnn is the first not rejected: table at its level
    for name, level in zip(order, step, strict=True):
        assert c[name]['holm_level'] == pytest.approx(1 - level)
        lo, hi = stats.interval(tests[name], 1 - level)
        if lo is not None:
            assert (c[name]['holm_lo'], c[name]['holm_hi']) == (round(lo, 2), round(hi, 2))
    assert [c[k]['sign'] for k in ('start', 'peg', 'peg-table', 'cnn', 'table')] == ['+', '+', '+', '=', '=']
    assert c['cnn']['p'] < 0.05 / 3 or c['cnn']['p'] > 0.05 / 2   # the case is not on a boundary
    p_holm = [min(1., (5 - j) * tests[k]['p']) for j, k in enumerate(order)]
    assert [c[k]['p_holm'] for k in order] == pytest.approx([max(p_holm[:j + 1]) for j in range(5)])
    assert {v['id']: v['verdict'] for v in summary['claims']} == dict(p='holds', t='not shown', pt='reversed',
                                                                     s='holds')
    assert summary['learns']['gaps'] == dict(learned=1.) and summary['learns']['holds'] is True
    # the ceiling: the PEG's native top-1 at 96 px (the higher test there) is 82 + 2 + 11 = 95.0 on average
    assert summary['ceiling']['tops'] == {'peg_0-5': 95.}
    assert summary['ceiling']['clear'] is False
    lower = proto.Protocol(dict(protocol.data, ceiling=dict(protocol['ceiling'], below=95.01)), protocol.path,
                           protocol.sha256)
    assert analysis.ceiling(summary['rows'], lower)['clear'] is True
    assert [p['epoch'] for p in summary['curves']['cnn']] == [1, 2]
    reference = summary['learns']['reference_val']
    for minimum, learned in ((reference, True), (reference + 0.01, False)):   # the reference itself must learn
        rule = dict(protocol['learns'], reference_min=minimum)
        strict = proto.Protocol(dict(protocol.data, learns=rule), protocol.path, protocol.sha256)
        got = analysis.learns(summary['arms'], strict)
        assert got['reference_learns'] is learned and got['holds'] is learned and got['gaps'] == dict(learned=1.)


def test_runs_without_shared_seeds_or_without_a_final_check_are_refused(tmp_path):
    protocol = _synthetic_protocol(tmp_path)
    records = _synthetic(protocol)
    with pytest.raises(ValueError, match='same seeds'):
        analysis.summarise(records[1:], protocol, ['learned', 'peg_0-5', 'cnn'])
    records[0]['checks'] = records[0]['checks'][:1]
    with pytest.raises(ValueError, match='not the final epoch 2'):
        analysis.summarise(records, protocol, ['learned', 'peg_0-5', 'cnn'])


def test_the_pilot_fixes_the_first_candidate_whose_learning_rule_holds_clear_of_the_ceiling_else_the_nearest():
    def summary(gap, reference_learns=True, clear=None):
        return dict(learns=dict(gaps=dict(learned=gap, none=gap - 1), reference_learns=reference_learns,
                                holds=reference_learns and gap <= 3),
                    ceiling=None if clear is None else dict(tops={'cnn': 90.}, clear=clear))
    assert analysis.pilot_choice(dict(a=summary(5.), b=summary(2.), c=summary(1.))) == dict(
        candidate='b', holds=True, gaps=dict(a=5., b=2., c=1.), clear=dict(a=True, b=True, c=True))
    assert analysis.pilot_choice(dict(a=summary(6.), b=summary(4.))) == dict(
        candidate='b', holds=False, gaps=dict(a=6., b=4.), clear=dict(a=True, b=True))
    # small gaps where the reference never learns either are not the nearest
    assert analysis.pilot_choice(dict(a=summary(1., False), b=summary(20.), c=summary(30.))) == dict(
        candidate='b', holds=False, gaps=dict(a=1., b=20., c=30.), clear=dict(a=True, b=True, c=True))
    assert analysis.pilot_choice(dict(a=summary(5., False), b=summary(4., False)))['candidate'] == 'b'
    # a candidate at the ceiling is passed over while another holds, and while another learns clear of it
    at, clear = dict(a=summary(1., clear=False), b=summary(2., clear=True)), dict(a=False, b=True)
    assert analysis.pilot_choice(at) == dict(candidate='b', holds=True, gaps=dict(a=1., b=2.), clear=clear)
    assert analysis.pilot_choice(dict(a=summary(4., clear=False), b=summary(9., clear=True)))['candidate'] == 'b'
    assert analysis.pilot_choice(dict(a=summary(4., clear=False), b=summary(9., False, True)))['candidate'] == 'a'
    choice = analysis.pilot_choice(dict(a=summary(4., clear=False), b=summary(6., clear=False)))
    assert choice['candidate'] == 'a' and choice['holds'] is False


# -- the report ----------------------------------------------------------------------------------------------------


def _git(root, *args):
    return subprocess.run(['git', '-C', str(root), '-c', 'user.name=t', '-c', 'user.email=t@t', *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_report_is_refused_from_a_dirty_tree_and_records_its_commit_apart_from_the_runs(tmp_path):
    protocol = _synthetic_protocol(tmp_path)
    records = [dict(r, protocol='synthetic.json', protocol_sha256=protocol.sha256) for r in _synthetic(protocol)]
    repo = tmp_path / 'repo'
    for folder in STUDIED_CODE:
        (repo / folder).mkdir(parents=True)
        (repo / folder / 'a.py').write_text('x = 1\n')
    _git(repo, 'init', '-q')
    _git(repo, 'add', '.')
    _git(repo, 'commit', '-q', '-m', 'c')
    meta = dict(command='python -m benchmarks.confirm_detail', wall_minutes=0.,
                object_scales={'': dict(levels=[50], crops=[5.], empty_crops=0.01, tests={})})
    document = render.write_outputs({'': records}, protocol, False, tmp_path / 'out', meta, root=repo)
    assert document['meta']['rendered_at'] == _git(repo, 'rev-parse', 'HEAD') != 'a' * 40
    assert document['meta']['run_commits'] == ['a' * 40]
    text = (tmp_path / 'out' / 'confirm_detail.md').read_text()
    assert f'rendered at commit {document["meta"]["rendered_at"][:10]}' in text and 'aaaaaaaaaa' in text
    assert '**reversed**' in text and '**not shown**' in text
    (repo / 'benchmarks' / 'a.py').write_text('x = 2\n')
    with pytest.raises(SystemExit, match='refusing to render a report from uncommitted code'):
        render.write_outputs({'': records}, protocol, False, tmp_path / 'out', meta, root=repo)
    _git(repo, 'commit', '-q', '-am', 'd')
    (repo / 'cpvt_backbones' / 'new.py').write_text('')   # untracked code counts too
    with pytest.raises(SystemExit, match='uncommitted'):
        render.write_outputs({'': records}, protocol, False, tmp_path / 'out', meta, root=repo)
    (repo / 'cpvt_backbones' / 'new.py').unlink()
    records[0] = dict(records[0], accelerator='other CPU')
    with pytest.raises(SystemExit, match='more than one accelerator'):
        render.write_outputs({'': records}, protocol, False, tmp_path / 'out', meta, root=repo)
    records[0] = dict(records[0], accelerator='test CPU', protocol_sha256='0' * 64)
    with pytest.raises(SystemExit, match='runs of another protocol'):
        render.write_outputs({'': records}, protocol, False, tmp_path / 'out', meta, root=repo)


# -- the study library it adds -------------------------------------------------------------------------------------


def _simulated_power(effect, sd, n, level, studies=400_000, margin=None):
    """The share of ``studies`` simulated studies of ``n`` normal pairs (mean ``effect``, SD ``sd``) whose
    two-sided ``level`` t interval lies above zero (or, with ``margin``, within +-margin)."""
    x = np.random.default_rng(0).normal(effect, sd, size=(studies, n))
    mean, half = x.mean(1), stats.t_quantile(level, n - 1) * x.std(1, ddof=1) / math.sqrt(n)
    return float(((mean - half > 0) if margin is None else ((mean - half > -margin) & (mean + half < margin))).mean())


def test_the_power_of_a_paired_t_interval_matches_its_known_value_and_a_simulation():
    assert stats.power_above(1., 1., 10, 0.95) == pytest.approx(0.8031, abs=2e-4)   # d = 1, n = 10 (G*Power)
    for effect, sd, n, level in ((1.8, 2.74, 5, 0.95), (1.8, 2.74, 5, 1 - 0.05 / 12), (1.8, 2.15, 16, 0.95),
                                 (0.5, 1., 2, 0.9)):
        assert stats.power_above(effect, sd, n, level) == pytest.approx(
            _simulated_power(effect, sd, n, level), abs=3e-3), (effect, sd, n, level)
    for sd, n, true in ((2.15, 16, 0.), (2.74, 16, 0.), (2.74, 16, 1.)):
        got = stats.power_within(2., sd, n, 0.90, true)
        assert got == pytest.approx(_simulated_power(true, sd, n, 0.90, margin=2.), abs=3e-3), (sd, n, true)
    # the normal limit: many pairs, the interval's half-width known
    assert stats.power_above(1., 4., 400, 0.95) == pytest.approx(
        statistics.NormalDist().cdf(1. * 20 / 4 - 1.96), abs=2e-3)
    with pytest.raises(ValueError, match='n >= 2 pairs'):
        stats.power_above(1., 1., 1, 0.95)
    with pytest.raises(ValueError, match='sd > 0'):
        stats.power_within(1., 0., 5, 0.9)


def _confirm_contrasts():
    by = {(r['variant'], r['seed']): r['checks'][-1]['final'] for r in load('confirm_detail')['runs']}
    detail = [(by['peg_0-5', s]['native68'] - by['peg_0-5', s]['upsampled68'])
              - (by['learned', s]['native68'] - by['learned', s]['upsampled68']) for s in range(5)]
    change = [(by['peg_0-5', s]['native68'] - by['peg_0-5', s]['native40'])
              - (by['learned', s]['native68'] - by['learned', s]['native40']) for s in range(5)]
    return detail, change


def test_the_confirmatory_report_states_the_power_it_had_the_bound_it_sets_and_the_papers_measure():
    """From its 30 stored run records: the PEG's gain from detail at 68 px less the table's had about 21% power
    (2.5% at Holm's first step of twelve) for the paper's +1.8, its 95% interval ends at +3.12, and the paper's
    own measure (the change from 40 to 68 px) is +0.88 [-3.29, +5.05]; the report and its verdict block say so."""
    detail, change = _confirm_contrasts()
    sd, t = statistics.stdev(detail), stats.t_quantile(0.95, 4)
    h = Confirm('confirm_detail', 'benchmarks/protocols/confirm_detail.json').load().document['summaries']['']
    h = h['hindsight']
    assert decision.PAPER_DIFFERENCE == h['effect'] == 1.8 and h['n'] == 5 and h['family'] == 12
    assert h['sd'] == round(sd, 2) == 2.74
    assert h['power'] == pytest.approx(_simulated_power(1.8, sd, 5, 0.95), abs=3e-3)
    assert h['power_holm'] == pytest.approx(_simulated_power(1.8, sd, 5, 1 - 0.05 / 12), abs=2e-3)
    assert (round(h['power'], 3), round(h['power_holm'], 3)) == (0.206, 0.025)
    assert h['bound'] == round(statistics.mean(detail) + t * sd / math.sqrt(5), 2) == 3.12
    half = t * statistics.stdev(change) / math.sqrt(5)
    assert (h['paper']['mean'], h['paper']['lo'], h['paper']['hi']) == (
        round(statistics.mean(change), 2), round(statistics.mean(change) - half, 2),
        round(statistics.mean(change) + half, 2)) == (0.88, -3.29, 5.05)
    report = (RESULTS / 'confirm_detail.md').read_text()
    block = verdict_cli.blocks_in((proto.ROOT / 'docs' / 'resolution_study.md').read_text())['confirm']
    readme, docs = (' '.join((proto.ROOT / name).read_text().split()) for name in ('README.md',
                                                                                    'docs/resolution_study.md'))
    paper = render._interval(h['paper'])   # the prose quotes what the code computes
    assert f'{h["power_holm"]:.1%} under Holm ({h["power"]:.1%} unadjusted)' in readme
    assert (f'{h["power_holm"]:.1%} at Holm\'s first step over its twelve contrasts and {h["power"]:.1%} '
            'unadjusted') in docs
    assert f'at {h["bound"]:+.2f} points' in readme and f'at most {h["bound"]:+.2f} points' in docs
    assert f'is {paper}' in readme and f'is {paper}' in docs
    for text in ('probability 20.6% unadjusted and 2.5% at Holm\'s first step over its 12 contrasts',
                 'at +3.12 points', 'PEG minus table: +0.88 [-3.29, +5.05] (95%, unadjusted), an interval covering 0 '
                 'and +1.8'):
        assert text in report and text in block, text


def test_t_distribution_matches_the_table_and_known_p_values():
    for df, q in enumerate(_T975, start=1):
        assert stats.t_quantile(0.95, df) == pytest.approx(q, abs=6e-4)
        assert stats.t_within(q, df) == pytest.approx(0.95, abs=1e-4)
    for t in (0.3, 1., 2., 7.5):   # closed forms: Cauchy, t/sqrt(t^2 + 2), and df 3's
        assert stats.t_within(t, 1) == pytest.approx(2 / math.pi * math.atan(t), abs=1e-12)
        assert stats.t_within(t, 2) == pytest.approx(t / math.sqrt(t * t + 2), abs=1e-12)
        u = t / math.sqrt(3)
        assert stats.t_within(t, 3) == pytest.approx(2 / math.pi * (math.atan(u) + u / (1 + u * u)), abs=1e-12)
    assert stats.t_within(0., 7) == 0. and stats.t_within(math.inf, 2) == 1.
    assert stats.t_quantile(1 - 0.05 / 12, 4) == pytest.approx(6.0, abs=0.25)   # Holm's first step of twelve
    with pytest.raises(ValueError, match='whole number'):
        stats.t_within(1., 2.5)
    test = stats.paired_test([1., 2., 3.5, 2.2, 0.1], [0.5, 1.9, 2., 2.5, -1.])
    d = paired([1., 2., 3.5, 2.2, 0.1], [0.5, 1.9, 2., 2.5, -1.])
    lo, hi = stats.interval(test, 0.95)
    assert (round(lo, 2), round(hi, 2)) == (d['lo'], d['hi'])
    assert stats.paired_test([1.], [0.])['p'] is None and stats.interval(stats.paired_test([1.], [0.]), .95) == (
        None, None)


def test_holm_rejects_step_down_and_its_intervals_exclude_zero_exactly_where_it_rejects():
    tests = {'a': dict(mean=1., se=0.1, n=5, p=0.001), 'b': dict(mean=-1., se=0.2, n=5, p=0.03),
             'c': dict(mean=1., se=0.3, n=5, p=0.011), 'd': dict(mean=1., se=None, n=1, p=None)}
    out = stats.holm(tests)
    # sorted a (0.001 <= .05/4), c (0.011 <= .05/3), b (0.03 > .05/2: stops), d (one pair: no p, b's level)
    assert [out[k]['rejected'] for k in 'acbd'] == [True, True, False, False]
    assert [out[k]['level'] for k in 'acbd'] == pytest.approx([1 - .05 / 4, 1 - .05 / 3, 1 - .05 / 2, 1 - .05 / 2])
    assert [out[k]['p_holm'] for k in 'acb'] == pytest.approx([0.004, 0.033, 0.06])
    assert out['d']['lo'] is None and out['d']['sign'] == '=' and out['b']['sign'] == '='
    assert list(out) == list(tests)
    for name, v in stats.holm({k: stats.paired_test(x, [0.] * 5) for k, x in dict(
            big=[5., 6., 7., 5.5, 6.5], mid=[1., 2., 0.5, 1.5, 1.], none=[1., -1., 0.5, -0.5, 0.2]).items()}).items():
        assert (v['lo'] > 0 or v['hi'] < 0) == v['rejected'], name


def test_blur_up_draws_a_share_of_the_crops_as_the_upsampled_tests_are_drawn():
    x = torch.randn(64, 3, 56, 56)
    everything = blur_up(x, [112], 1., torch.Generator().manual_seed(0))
    assert torch.allclose(everything, resize(resize(x, 28), 56))
    assert torch.equal(blur_up(x, [112], 0., torch.Generator().manual_seed(0)), x)
    half = blur_up(x, [80, 96, 112], 0.5, torch.Generator().manual_seed(1))
    changed = (half != x).flatten(1).any(1)
    assert 16 < int(changed.sum()) < 48
    assert torch.equal(half, blur_up(x, [80, 96, 112], 0.5, torch.Generator().manual_seed(1)))
    for i in changed.nonzero().flatten().tolist():
        assert any(torch.allclose(half[i], resize(resize(x[i:i + 1], round(56 * 56 / s)), 56)[0])
                   for s in (80, 96, 112))
    with pytest.raises(ValueError, match='sizes above'):
        blur_up(x, [56], 0.5, torch.Generator())


class _Linear(torch.nn.Linear):
    def no_weight_decay(self):
        return set()


def test_warm_up_stem_layers_and_the_conv_mlp_arm():
    model = _Linear(2, 2)
    for warmup, total, steps in ((0.1, 672, 67), (0.1, 675, 67), (2 / 16, 16 * 56, 112), (0., 10, 1)):
        _, sched = make_optimizer(model, StudyConfig(warmup=warmup), total)
        factors = [sched.lr_lambdas[0](s) for s in range(total)]
        assert factors.index(1.) == steps - 1, (warmup, total)
    with pytest.raises(ValueError, match='warmup must be in'):
        StudyConfig(warmup=1.5)
    stem = ConvStem(3, 16, 4, extra=2)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in stem) == 4 and stem(torch.randn(1, 3, 28, 36)).shape == (
        1, 16, 7, 9)
    x = torch.randn(1, 3, 28, 36)   # circular padding throughout: still no border
    assert torch.allclose(stem(torch.roll(x, (4, 8), dims=(2, 3))), torch.roll(stem(x), (1, 2), dims=(2, 3)), atol=1e-5)
    with pytest.raises(ValueError, match='stem_layers'):
        StudyConfig(stem_layers=1)
    with pytest.raises(ValueError, match='stem_norm needs the convolutional stem'):
        StudyConfig(stem_norm=True)
    normed = ConvStem(3, 16, 4, extra=2, norm=True)   # a BatchNorm after every convolution, GELU between
    kinds = [type(m).__name__ for m in normed]
    assert kinds == ['Conv2d', 'BatchNorm2d', 'GELU'] * 3 + ['Conv2d', 'BatchNorm2d']
    assert [k for k in kinds if k != 'BatchNorm2d'] == [type(m).__name__ for m in stem]   # same convs otherwise
    for mode in (normed.train, normed.eval):   # batch statistics or running ones: still no border
        mode()
        assert torch.allclose(normed(torch.roll(x, (4, 8), dims=(2, 3))), torch.roll(normed(x), (1, 2), dims=(2, 3)),
                              atol=1e-4)
    y = normed.train()(torch.randn(8, 3, 28, 36) * 5 + 3)
    assert y.mean(dim=(0, 2, 3)).abs().max() < 1e-4 and (y.var(dim=(0, 2, 3), unbiased=False) - 1).abs().max() < 1e-2
    config = StudyConfig().replace(variants=('conv_mlp',), head='gap', stem=True, stem_layers=1, image_size=56,
                                   test_sizes=(56, 112), patch=4, in_chans=3, num_classes=4, dim=16)
    model = build_model('conv_mlp', config)
    assert all(isinstance(b.mlp, ConvMlp) for b in model.net.blocks) and not model.net.pos_encodings
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.stem) == 3
    assert model(torch.randn(2, 3, 56, 56)).shape == (2, 4) and model(torch.randn(1, 3, 112, 112)).shape == (1, 4)
    assert 'conv_mlp' not in StudyConfig().variants   # the resolution study's default grid is the encodings'
    plain = set(build_model('none', config).state_dict())   # the arm differs from no encoding in its MLPs alone
    assert set(model.state_dict()) - plain == {f'net.blocks.{j}.mlp.dwconv.{p}' for j in range(6)
                                               for p in ('weight', 'bias')} and plain <= set(model.state_dict())


def test_the_fixed_protocol_is_the_last_pilots_draft_with_the_chosen_candidates_changes_in_its_recipe():
    protocol = proto.Protocol.load(proto.PROTOCOL)
    draft = proto.Protocol.load(proto.ROOT / 'benchmarks' / 'protocols' / f'{protocol["pilot"]["name"]}.json')
    report = json.loads((RESULTS / f'{protocol["pilot"]["name"]}.json').read_text())
    chosen = report['choice']['candidate']
    assert protocol.status == 'fixed' and draft.status == 'draft' and report['meta']['protocol_sha256'] == draft.sha256
    assert protocol['recipe'] == {**draft['recipe'], **draft['pilot']['recipes'][chosen]}
    assert {k: v for k, v in protocol.data.items() if k not in ('status', 'recipe')} == \
        {k: v for k, v in draft.data.items() if k not in ('status', 'recipe')}
    # every pilot run the report read was run under the draft
    pilot_runs = RESULTS / 'recipe_runs' / draft['pilot']['name']
    runs = sorted(pilot_runs.glob('*/*/result.json'))
    assert len(runs) == len(draft['pilot']['recipes']) * len(draft['pilot']['arms']) * len(draft['pilot']['seeds'])
    assert {json.loads(p.read_text())['protocol_sha256'] for p in runs} == {draft.sha256}
