"""The resolution verdict (benchmarks/verdict/): the documents' tables are what the report code renders from
the committed result files, one device per comparison, seeds as fixed in advance."""
import copy
import json
import re

import pytest

from benchmarks.confirm_detail.spec import Confirm
from benchmarks.study import summary
from benchmarks.verdict import blocks, classification, cli, dense_demo, tables


def test_every_verdict_table_in_the_documents_is_rendered_from_the_result_files():
    rendered = {block.name: blocks.render(block) for block in blocks.BLOCKS}
    found = set()
    for path in cli.DOCUMENTS:
        for name, body in cli.blocks_in(path.read_text()).items():
            assert body == rendered[name], f'{path.name}: block {name} is stale (python -m benchmarks.verdict --write)'
            found.add(name)
    assert found == set(blocks.BLOCK), f'blocks no document shows: {set(blocks.BLOCK) - found}'


def study(tmp_path, name, records, **meta):
    base = dict(dataset='Fashion-MNIST', train_images=100, test_images=10, image_size=14, test_sizes=[14, 28],
                epochs=1, batch_size=8, lr=1e-3, weight_decay=0.05, drop_path=0.1, crop_scale=0.25,
                crop_resample='antialiased', test_resample='bilinear', decay_position=False,
                model=dict(dim=8, head='gap'), runs=name)
    base.update(meta)
    (tmp_path / f'{name}.json').write_text(json.dumps(dict(meta=base, runs=records)))


def run(variant, seed, device, at1x, at2x):
    return dict(variant=variant, seed=seed, device=device, top1={'14': at1x, '28': at2x})


def test_pooling_refuses_other_recipes_and_splits_devices_and_late_seeds(tmp_path):
    study(tmp_path, 'a', [run('learned', s, 'cuda', 70 + s, 60) for s in range(3)]
          + [run('learned', 3, 'cpu', 99, 0)])
    study(tmp_path, 'b', [run('learned', s, 'cpu', 72 + s, 61) for s in range(3)])
    study(tmp_path, 'c', [run('learned', 0, 'cpu', 50, 40)], lr=2e-3)
    meta, runs = summary.pooled_runs(('a', 'b'), tmp_path)
    assert meta['lr'] == 1e-3 and len(runs) == 7
    cpu, gpu = summary.by_device(runs, 'cpu'), summary.by_device(runs, 'cuda')
    assert sorted(cpu['learned']) == [0, 1, 2] and cpu['learned'][0]['14'] == 72   # seed 3 came late: left out
    assert gpu['learned'][2]['14'] == 72 and summary.by_device(runs, 'cpu', seeds=None)['learned'][3]['14'] == 99
    with pytest.raises(ValueError, match=r"a and c differ in their recipe: \{'lr': \(0.001, 0.002\)\}"):
        summary.pooled_runs(('a', 'c'), tmp_path)
    study(tmp_path, 'd', [run('learned', 0, 'cpu', 72, 61), run('learned', 0, 'cpu', 73, 61)], runs='other')
    with pytest.raises(ValueError, match=r"d: run \('other', 'learned', 0\) has other results than in another"):
        summary.pooled_runs(('d',), tmp_path)
    study(tmp_path, 'e', [run('learned', 0, 'cpu', 80, 61)], runs='elsewhere')
    with pytest.raises(ValueError, match='learned seed 0 on cpu: two runs with other results'):
        summary.by_device(summary.pooled_runs(('b', 'e'), tmp_path)[1], 'cpu')


def test_a_leader_is_named_only_where_the_interval_excludes_zero():
    assert tables.leader({'learned': [3., 4., 5.], 'none': [1., 2., 3.2]}).startswith(
        'learned table, resized (DeiT), ahead of every other (of no position encoding, the runner-up, by +1.93 [')
    assert tables.leader({'learned': [3., 1., 5.], 'none': [1., 2., 3.]}) == (
        'no leader: learned table, resized (DeiT) highest on average, not separated from no position encoding')


def test_rewriting_the_documents_blocks():
    text = 'intro\n<!-- verdict:control -->\nold\n<!-- /verdict:control -->\nend\n<!-- verdict:recipes -->\n' \
           '<!-- /verdict:recipes -->\n'
    assert cli.blocks_in(text) == {'control': 'old', 'recipes': ''}
    new = cli.rewrite(text, {'control': 'A\nB', 'recipes': 'C'})
    assert new == 'intro\n<!-- verdict:control -->\nA\nB\n<!-- /verdict:control -->\nend\n<!-- verdict:recipes ' \
                  '-->\nC\n<!-- /verdict:recipes -->\n'
    assert cli.rewrite(new, {'control': 'A\nB', 'recipes': 'C'}) == new
    with pytest.raises(ValueError, match=r"unknown verdict block\(s\) \['nonsense'\]"):
        cli.rewrite('<!-- verdict:nonsense -->\nx\n<!-- /verdict:nonsense -->', {})


def test_the_demo_keeps_every_engine_and_precision_it_ran_within_the_tolerance():
    """The committed demo summary: every engine and precision within DEMO_TOLERANCE of torch float32 at every
    test size (what lets the registry offer onnxruntime's int8)."""
    data = summary.load(dense_demo.DEMO_ENGINES)
    columns = set()
    for task, by_size in data['results'].items():
        for size, scores in by_size.items():
            for column, value in scores.items():
                columns.add(column)
                assert round(abs(value - scores[dense_demo.DEMO_REFERENCE]), 3) <= dense_demo.DEMO_TOLERANCE, \
                    (task, size, column)
    assert {'onnxruntime fp32', 'onnxruntime int8'} <= columns
    assert 'within 0.005' in blocks.render('demo-engines')


def test_the_demo_is_timed_from_nothing_and_its_engines_compared_on_its_own_trainings(tmp_path):
    """The demo block states `make demo`'s wall time only from a run that trained every task, at the commit it ran
    (refusing a run on a tree with uncommitted changes); the engines block compares only an evaluation that reused
    that run's trainings. Each refuses otherwise, naming why."""
    for name in (dense_demo.DEMO, dense_demo.DEMO_ENGINES):
        (tmp_path / f'{name}.json').write_text((summary.RESULTS / f'{name}.json').read_text())
    assert blocks.render('demo', tmp_path) == blocks.render('demo')
    assert blocks.render('demo-engines', tmp_path) == blocks.render('demo-engines')
    assert 'UperNet mIoU' in blocks.render('demo') and 'Mask R-CNN segm mAP' in blocks.render('demo')
    timed = summary.load(dense_demo.DEMO)
    timed['trained'].remove('instances')
    (tmp_path / f'{dense_demo.DEMO}.json').write_text(json.dumps(timed))
    with pytest.raises(ValueError, match=r"reused: \['instances'\]"):
        blocks.render('demo', tmp_path)
    timed = summary.load(dense_demo.DEMO)
    (tmp_path / f'{dense_demo.DEMO}.json').write_text(json.dumps(dict(timed, commit='0123456789abcdef', dirty=False)))
    assert 'into another folder) at commit 0123456 trained' in blocks.render('demo', tmp_path)
    (tmp_path / f'{dense_demo.DEMO}.json').write_text(json.dumps(dict(timed, commit='0123456789abcdef', dirty=True)))
    with pytest.raises(ValueError, match='uncommitted changes at 0123456789abcdef: run the demo on a clean clone'):
        blocks.render('demo', tmp_path)
    engines = summary.load(dense_demo.DEMO_ENGINES)
    engines['command'] += ' --retrain'
    engines['trained'] = ['detection']
    (tmp_path / f'{dense_demo.DEMO_ENGINES}.json').write_text(json.dumps(engines))
    with pytest.raises(ValueError, match=r"trained now: \['detection'\]"):
        blocks.render('demo-engines', tmp_path)


def test_the_preregistered_study_table_is_its_report_analysed_again_from_its_runs(tmp_path):
    """On the last pilot's report (written by the study itself): the block's loader renders the committed Markdown
    from the runs alone, a run's changed reading changes it, and another protocol or a second device is refused."""
    spec = Confirm('confirm_detail_pilot6', 'benchmarks/protocols/confirm_detail_pilot6.json')
    saved = summary.load('confirm_detail_pilot6')
    assert spec.load().markdown() == (summary.RESULTS / 'confirm_detail_pilot6.md').read_text().rstrip('\n')
    assert dense_demo.confirm(spec.load()) == spec.load().markdown()
    stale = copy.deepcopy(saved)
    stale['summaries'] = {}    # the loader recomputes every analysis: nothing is read from the stored ones
    (tmp_path / 'confirm_detail_pilot6.json').write_text(json.dumps(stale))
    assert spec.load(tmp_path).markdown() == spec.load().markdown()
    changed = copy.deepcopy(saved)
    peg = next(r for r in changed['runs'] if r['variant'] == 'peg_0-5' and r['candidate'] == 'objects075_long')
    peg['checks'][-1]['final']['native68'] -= 10.
    (tmp_path / 'confirm_detail_pilot6.json').write_text(json.dumps(changed))
    text = spec.load(tmp_path).markdown()
    assert text != spec.load().markdown() and 'PEG after blocks 0-5 (CPVT)' in text
    other = copy.deepcopy(saved)
    other['runs'][0]['protocol_sha256'] = '0' * 64
    (tmp_path / 'confirm_detail_pilot6.json').write_text(json.dumps(other))
    with pytest.raises(ValueError, match=r"confirm_detail_pilot6: its runs record protocol sha256 \['000000000000', "
                                         r"'06ec0c22ad15'\], not benchmarks/protocols/confirm_detail_pilot6.json's"):
        spec.load(tmp_path)
    two = copy.deepcopy(saved)
    two['runs'][0]['accelerator'] = 'NVIDIA H200'
    (tmp_path / 'confirm_detail_pilot6.json').write_text(json.dumps(two))
    with pytest.raises(ValueError, match=r"runs trained on \['AMD EPYC \(AVX2\)', 'NVIDIA H200'\]; a table compares"):
        spec.load(tmp_path)


def test_a_leader_is_named_only_when_separated_from_every_other():
    """The leader's paired interval must exclude zero against every other encoding, not only the runner-up."""
    ahead = {'learned': [5., 6., 7.], 'none': [1., 1.5, 1.2], 'peg_0-5': [0., 0.5, 0.1]}
    assert tables.leader(ahead).startswith('learned table, resized (DeiT), ahead of every other')
    noisy = dict(ahead, peg_0=[9., -3., 3.])
    assert tables.leader(noisy) == ('no leader: learned table, resized (DeiT) highest on average, not separated '
                                     'from PEG after block 0 (CPVT)')


def test_the_figures_draw_the_one_device_runs(tmp_path):
    paths = blocks.headline_figures(out=tmp_path) + [blocks.recipes_figure(out=tmp_path)]
    assert [p.name for p in paths] == ['verdict_headline.png', 'verdict_headline_probe.png', 'verdict_recipes.png']
    assert all(p.stat().st_size > 20_000 for p in paths)
    for path in paths:   # the documents show the committed ones
        assert f'benchmarks/results/{path.name}' in cli.DOCUMENTS[1].read_text()


def test_a_new_table_is_one_declared_block(tmp_path):
    """A block is data (name, comparison, inputs, options) over the one renderer: a table of a study's changes
    declared here renders from its result file, and a study missing a seed it must have is refused by name."""
    study(tmp_path, 'a', [run('learned', s, 'cpu', 70 + s, 60 + 2 * s) for s in range(3)]
          + [run('none', s, 'cpu', 60, 50 - s) for s in range(2)])
    block = blocks.Block('mine', classification.changes, dict(s=summary.Study(('a',), 'cpu')),
                          dict(note='seeds {seeds} on the {device_name}; {files}'))
    text = blocks.render(block, tmp_path)
    assert text.splitlines()[:3] == [
        '| position encoding | 14 px (1x) | change at 28 px (2x) |', '|---|---|---|',
        '| no position encoding | 60.0 ± 0.0 | **-10.50 [-16.85, -4.15]** |']
    assert text.endswith('seeds 0, 1, 2 on the CPU; `a.json`')
    complete = blocks.Block('mine', classification.changes, dict(s=summary.Study(('a',), complete=('*',))),
                            dict(note=''))
    with pytest.raises(ValueError, match=r"a: needs seeds \(0, 1, 2\) of every variant on cpu"):
        blocks.render(complete, tmp_path)
    source = '\n'.join(p.read_text() for p in sorted((cli.ROOT / 'benchmarks/verdict').glob('*.py')))
    assert re.findall(r'(\w+)\.(?:parse_args|main)\(', source) == ['p']   # its own options; no study through argv
