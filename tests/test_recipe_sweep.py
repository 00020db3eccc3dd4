"""The recipe sweep's cells, verdicts and choices, on made-up results (the studies it runs are tested in
test_resolution_study)."""
import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks import recipe_sweep as sweep

ENC = sweep.ENCODINGS


def _cell(name, values, seeds=3, image_size=14):
    """A loaded cell: ``values[size][encoding]`` is a list of per-seed top-1 or one number for every seed."""
    top1 = {v: {size: (per[v] if isinstance(per[v], list) else [per[v]] * seeds) for size, per in values.items()}
            for v in ENC}
    return dict(cell=name, label=name, seeds=list(range(seeds)), image_size=image_size, top1=top1)


def test_cells_are_the_default_config_with_fields_replaced():
    s = sweep.Sweep('small', Path('/out'), dict(device='cpu', data=Path('/data'), work_dir=Path('/runs')))
    default = s.config('default', [0, 1])
    assert (default.run_set, default.name, default.seeds, default.head) == (
        'recipe_sweep_default', 'recipe_sweep_default', (0, 1), 'gap')
    assert default.out == Path('/out/recipe_sweep') and default.work_dir == Path('/runs')
    bicubic = s.config('bicubic', [0])
    assert bicubic.run_set == 'recipe_sweep_default' and bicubic.test_resample == 'bicubic'  # reuses the runs
    both = s.config('aliased+bicubic', [0])
    assert both.run_set == 'recipe_sweep_aliased' and (both.crop_resample, both.test_resample) == ('aliased', 'bicubic')
    longer = s.config('schedule3x', [0])
    assert longer.epochs == 12 and longer.run_set == 'recipe_sweep_schedule3x'
    tiny = sweep.Sweep('small', Path('/out'), dict(epochs=2))
    assert tiny.config('schedule3x', [0]).epochs == 6
    wide = s.config('width96+lr2e-3', [0])
    assert (wide.dim, wide.heads, wide.lr, wide.crop_resample) == (96, 3, 2e-3, 'antialiased')
    assert s.config('cls', [0]).head == 'cls'
    assert dataclasses.replace(s.config('cls', [0]), head='gap', name=default.name, runs=default.runs, seeds=(0, 1)) \
        == default   # a recipe differs from the default in its fields only
    large = sweep.Sweep('large', Path('/o')).config('default', [0])
    assert (large.train_images, large.patch, large.image_size // large.patch) == (60000, 1, 14)
    for bad in ('wider', 'aliased+aliased', 'default+aliased'):
        with pytest.raises(ValueError, match='unknown recipe cell'):
            sweep.cell_recipe(bad)
    for argv in (['--cells', 'default', 'nope'], ['--set', 'nope=1'], ['--set', 'patch=3']):
        with pytest.raises(SystemExit):
            sweep.parse_args(argv)


def test_verdict_orders_encodings_and_pairs_the_lead_by_seed():
    base = {v: 70. for v in ENC}
    at2x = dict(none=40., learned=[60., 61., 55.], peg_0=50., **{'peg_0-5': [58., 57., 59.]}, rope_mixed=45.)
    rows = sweep.verdict(_cell('default', {14: base, 28: at2x}))
    row = next(r for r in rows if r['size'] == 28)
    assert row['order'] == ['learned', 'peg_0-5', 'peg_0', 'rope_mixed', 'none'] and row['factor'] == 2
    assert row['lead']['mean'] == pytest.approx(0.67, abs=0.01) and row['lead']['sign'] == '='   # tied
    assert row['learned_change']['mean'] == pytest.approx(-11.33, abs=0.01) and row['learned_change']['sign'] == '-'
    at2x['learned'] = [60., 61., 62.]
    row = next(r for r in sweep.verdict(_cell('default', {14: base, 28: at2x})) if r['size'] == 28)
    assert row['lead']['sign'] == '+'
    assert '(tied)' in sweep.verdict_table(rows)[3] and '(tied)' not in sweep.verdict_table([row])[2]


def test_paper_claim_needs_intervals_that_exclude_zero():
    base = {v: 70. for v in ENC}
    gain = dict(base, peg_0=[71., 71.5, 72.], learned=[68., 67.5, 68.2])
    lose = dict(base, peg_0=[66., 67., 66.5], learned=[68., 69., 68.5])
    unclear = dict(base, peg_0=[71., 69., 70.5], learned=[70., 69.5, 71.])
    assert sweep.paper_claim(_cell('c', {14: base, 20: gain}), 'peg_0').startswith('reproduced (change +1.50 [')
    assert sweep.paper_claim(_cell('c', {14: base, 20: lose}), 'peg_0').startswith('not reproduced')
    assert sweep.paper_claim(_cell('c', {14: base, 20: unclear}), 'peg_0').startswith('undecided')


def test_cells_trained_on_two_devices_are_judged_per_device_never_pooled(tmp_path):
    base = {v: 70. for v in ENC}
    at2x = dict(none=40., learned=[60., 61., 55.], peg_0=50., **{'peg_0-5': [58., 57., 59.]}, rope_mixed=45.)
    cell = dict(_cell('default', {14: base, 28: at2x}), devices=['cuda', 'cuda', 'cpu'])
    gpu, cpu = sweep.by_device(cell)
    assert (gpu['seeds'], cpu['seeds']) == ([0, 1], [2]) and cpu['cell'] == 'default (cpu)'
    assert gpu['top1']['learned'][28] == [60., 61.] and cpu['top1']['peg_0-5'][28] == [59.]
    assert next(r for r in sweep.verdict(cpu) if r['size'] == 28)['leader'] == 'peg_0-5'  # learned leads on cuda
    assert next(r for r in sweep.verdict(gpu) if r['size'] == 28)['leader'] == 'learned'
    assert [c['cell'] for c in sweep.by_device(dict(cell, devices=['cpu'] * 3))] == ['default (cpu)']
    assert cell['top1']['learned'][28] == [60., 61., 55.]  # the cell itself is left whole
    meta = dict(scale='small', wall_minutes=0., device='cpu', command='python -m benchmarks.recipe_sweep')
    sweep.write_outputs([cell], sweep.Sweep('small', tmp_path), meta)
    rows = [line.split(' | ')[:2] for line in (tmp_path / 'recipe_sweep.md').read_text().splitlines()
            if line.startswith('| default')]
    # two sizes per device in the verdict table, then one line per device in the paper's-claim table
    assert rows[:4] == [['| default (cuda)', '0,1']] * 2 + [['| default (cpu)', '2']] * 2
    assert [r[0] for r in rows[4:]] == ['| default (cuda)', '| default (cpu)']
    verdict = json.loads((tmp_path / 'recipe_sweep.json').read_text())['verdict']
    assert [(r['recipe'], r['seeds']) for r in verdict] == ([('default (cuda)', '0,1')] * 2
                                                             + [('default (cpu)', '2')] * 2)


def test_a_tiny_sweep_end_to_end(tmp_path, fake_fmnist):
    """Two cells (the default and a test-time factor that reuses its runs), one seed, a tiny study: every cell's
    study outputs and the sweep's table, with the study command each cell's config stands for."""
    tiny = ['train_images=64', 'test_images=20', 'probe_images=0', 'epochs=1', 'batch_size=32', 'dim=8',
            'image_size=28', 'patch=4', 'test_sizes=28,40,56']
    cells = sweep.main(['--cells', 'default', 'bicubic', '--seeds', '0', '--jobs', '1', '--data', str(fake_fmnist),
                        '--set', *tiny, '--work-dir', str(tmp_path / 'runs'), '--out', str(tmp_path / 'out')])
    assert [c['cell'] for c in cells] == ['default', 'bicubic'] and cells[0]['devices'] == ['cpu']
    assert sorted(p.name for p in (tmp_path / 'runs').iterdir()) == ['recipe_sweep_default']   # one training
    study = json.loads((tmp_path / 'out' / 'recipe_sweep' / 'recipe_sweep_bicubic.json').read_text())
    assert study['meta']['command'].startswith('python -m benchmarks.resolution_study --name recipe_sweep_bicubic')
    command = study['meta']['command']
    assert '--test-resample bicubic' in command and '--runs recipe_sweep_default' in command
    text = (tmp_path / 'out' / 'recipe_sweep.md').read_text()
    assert '| default (cpu) | 0 | 40 px (1.43x) |' in text
    assert 'python -m benchmarks.recipe_sweep --cells default' in text


def test_one_job_trains_each_run_once_here_with_the_threads_asked_for(tmp_path, monkeypatch):
    """--jobs 1: the runs train in this process, each once (a test-time cell shares the default's), on splits
    loaded once, with --threads torch threads; the cells' studies follow with the thread count as it was."""
    import torch
    loaded, trained, studied = [], [], []
    monkeypatch.setattr(sweep, 'load_split', lambda path, split, n: loaded.append((split, n)) or split)
    monkeypatch.setattr(sweep, 'run', lambda variant, seed, config, data, run_dir: trained.append(
        (config.run_set, variant, seed, data, torch.get_num_threads(), run_dir)))
    monkeypatch.setattr(sweep, 'run_study', lambda config: studied.append((config.name, torch.get_num_threads())))
    before = torch.get_num_threads()
    s = sweep.Sweep('small', tmp_path, dict(work_dir=tmp_path / 'runs'))
    sweep.run_cells(s, ['default', 'bicubic', 'aliased'], [0, 1], 1, before + 1)
    assert loaded == [('train', 20000), ('test', 2500)]
    assert [t[:3] for t in trained] == [(f'recipe_sweep_{c}', v, seed) for c in ('default', 'aliased')
                                        for seed in (0, 1) for v in ENC]
    assert {t[3:5] for t in trained} == {(('train', 'test'), before + 1)}
    assert trained[0][5] == tmp_path / 'runs' / 'recipe_sweep_default' / 'none-seed0'
    assert studied == [(f'recipe_sweep_{c}', before) for c in ('default', 'bicubic', 'aliased')]
    assert torch.get_num_threads() == before
