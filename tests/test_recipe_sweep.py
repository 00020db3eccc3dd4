"""The recipe sweep's cells, verdicts and choices, on made-up results (the studies it runs are tested in
test_resolution_study)."""
from pathlib import Path

import pytest

from benchmarks import recipe_sweep as sweep

ENC = sweep.ENCODINGS


def _cell(name, values, seeds=3, image_size=14):
    """A loaded cell: ``values[size][encoding]`` is a list of per-seed top-1 or one number for every seed."""
    top1 = {v: {size: (per[v] if isinstance(per[v], list) else [per[v]] * seeds) for size, per in values.items()}
            for v in ENC}
    return dict(cell=name, label=name, seeds=list(range(seeds)), image_size=image_size, top1=top1)


def test_cells_compose_the_study_command_lines():
    s = sweep.Sweep('small', 'cpu', '/data', Path('/runs'), Path('/out'))
    default = s.argv('default', [0, 1])
    assert default[default.index('--runs') + 1] == 'recipe_sweep_default'
    assert default[default.index('--name') + 1] == 'recipe_sweep_default'
    bicubic = s.argv('bicubic', [0])
    assert bicubic[bicubic.index('--runs') + 1] == 'recipe_sweep_default'  # a test-time factor reuses the runs
    assert bicubic[bicubic.index('--test-resample') + 1] == 'bicubic'
    both = s.argv('aliased+bicubic', [0])
    assert both[both.index('--runs') + 1] == 'recipe_sweep_aliased'
    longer = sweep.rs.parse_args(s.argv('schedule3x', [0]))
    assert longer.epochs == 12 and longer.runs == 'recipe_sweep_schedule3x'
    tiny = sweep.Sweep('small', 'cpu', '/data', Path('/runs'), Path('/out'), ('--epochs', '2'))
    assert sweep.rs.parse_args(tiny.argv('schedule3x', [0])).epochs == 6
    wide = sweep.rs.parse_args(s.argv('width96+lr2e-3', [0]))
    assert (wide.dim, wide.heads, wide.lr, wide.crop_resample) == (96, 3, 2e-3, 'antialiased')
    cls = sweep.rs.parse_args(s.argv('cls', [0]))
    assert cls.head == 'cls' and sweep.rs.parse_args(default).head == 'gap'
    large = sweep.rs.parse_args(sweep.Sweep('large', 'cuda', '/d', Path('/r'), Path('/o')).argv('default', [0]))
    assert (large.train_images, large.patch, large.image_size // large.patch) == (60000, 1, 14)
    for bad in ('wider', 'aliased+aliased', 'default+aliased'):
        with pytest.raises(ValueError, match='unknown recipe cell'):
            sweep.cell_recipe(bad)
    with pytest.raises(SystemExit):
        sweep.parse_args(['--cells', 'default', 'nope'])


def test_verdict_orders_encodings_and_pairs_the_lead_by_seed():
    base = {v: 70. for v in ENC}
    at2x = dict(none=40., learned=[60., 61., 55.], peg_0=50., **{'peg_0-5': [58., 57., 59.]}, rope_mixed=45.)
    rows = sweep.verdict(_cell('default', {14: base, 28: at2x}))
    row = next(r for r in rows if r['size'] == 28)
    assert row['order'] == ['learned', 'peg_0-5', 'peg_0', 'rope_mixed', 'none'] and row['factor'] == 2
    assert row['lead_mean'] == pytest.approx(0.67, abs=0.01) and row['lead_seeds'] == '2/3'
    assert row['learned_change'] == pytest.approx(-11.33, abs=0.01)
    assert sweep.needs_more_seeds(_cell('default', {14: base, 28: at2x}))
    at2x['learned'] = [60., 61., 62.]
    assert not sweep.needs_more_seeds(_cell('default', {14: base, 28: at2x}))


def test_paper_claim_and_order_movement():
    base = {v: 70. for v in ENC}
    gain = dict(base, peg_0=71., learned=68.)
    less = dict(base, peg_0=69., learned=[66., 67., 68.])
    more = dict(base, peg_0=65., learned=68.)
    assert sweep.paper_claim(_cell('c', {14: base, 20: gain}), 'peg_0').startswith('reproduced (+1.00 vs table -2.00')
    assert sweep.paper_claim(_cell('c', {14: base, 20: less}), 'peg_0').startswith('partly')
    assert sweep.paper_claim(_cell('c', {14: base, 20: more}), 'peg_0').startswith('not reproduced')
    ref = _cell('d', {28: dict(none=10., learned=50., peg_0=40., **{'peg_0-5': 30.}, rope_mixed=20.)})
    same_order = _cell('f', {28: dict(none=11., learned=51., peg_0=41., **{'peg_0-5': 31.}, rope_mixed=21.)})
    swapped = _cell('g', {28: dict(none=10., learned=40., peg_0=50., **{'peg_0-5': 30.}, rope_mixed=20.)})
    assert sweep.order_movement(ref, same_order, 28) == (0, 0.)  # a shift of every encoding moves no order
    assert sweep.order_movement(ref, swapped, 28) == (1, 20.)


def test_cells_trained_on_two_devices_are_also_judged_per_device():
    base = {v: 70. for v in ENC}
    at2x = dict(none=40., learned=[60., 61., 55.], peg_0=50., **{'peg_0-5': [58., 57., 59.]}, rope_mixed=45.)
    cell = dict(_cell('default', {14: base, 28: at2x}), devices=['cuda', 'cuda', 'cpu'])
    gpu, cpu = sweep.split_by_device(cell)
    assert (gpu['seeds'], cpu['seeds']) == ([0, 1], [2]) and cpu['cell'] == 'default (cpu, seeds 2)'
    assert gpu['top1']['learned'][28] == [60., 61.] and cpu['top1']['peg_0-5'][28] == [59.]
    assert next(r for r in sweep.verdict(cpu) if r['size'] == 28)['leader'] == 'peg_0-5'  # learned leads on cuda
    assert next(r for r in sweep.verdict(gpu) if r['size'] == 28)['leader'] == 'learned'
    assert sweep.split_by_device(dict(cell, devices=['cpu'] * 3)) == []
    assert cell['top1']['learned'][28] == [60., 61., 55.]  # the cell itself is left whole
