"""The studies' shared run grid (``benchmarks.study.grid``): shards partition the runs, a run is done once its
result.json exists, the report waits for every shard, and the report's files are written as listed."""
import json

import pytest

from benchmarks.study.grid import Grid, write_report


def test_shards_partition_the_runs_and_the_report_waits_for_all(tmp_path, capsys):
    keys = [(v, s) for s in range(3) for v in ('a', 'b')]
    grids = [Grid(keys, lambda k: [tmp_path / f'{k[0]}-seed{k[1]}'], i, 2) for i in range(2)]
    shards = [g.shard() for g in grids]
    assert sorted(shards[0] + shards[1]) == sorted(keys) and not set(shards[0]) & set(shards[1])
    for key in shards[0]:
        (tmp_path / f'{key[0]}-seed{key[1]}').mkdir()
        (tmp_path / f'{key[0]}-seed{key[1]}' / 'result.json').write_text('{}')
    assert grids[0].todo() == [] and grids[1].todo() == shards[1]
    assert not grids[0].complete('t')
    assert '3 run(s) of other shards pending (b-seed0, b-seed1, b-seed2)' in capsys.readouterr().out
    for key in shards[1]:
        (tmp_path / f'{key[0]}-seed{key[1]}').mkdir()
        (tmp_path / f'{key[0]}-seed{key[1]}' / 'result.json').write_text('{}')
    assert grids[1].complete('t') and capsys.readouterr().out == ''
    with pytest.raises(ValueError, match='shard must be K/N'):
        Grid(keys, lambda k: [], 2, 2)
    with pytest.raises(ValueError, match='each run once'):
        Grid([1, 1], lambda k: [])


def test_a_group_is_done_only_when_each_of_its_runs_is(tmp_path):
    grid = Grid([0], lambda k: [tmp_path / 'detection', tmp_path / 'segmentation'])
    (tmp_path / 'detection').mkdir()
    (tmp_path / 'detection' / 'result.json').write_text('{}')
    assert grid.todo() == [0]


def test_write_report_writes_each_listed_file(tmp_path):
    drawn = []
    write_report(tmp_path / 'out', 'study', dict(meta={}, runs=[1]), '| a |\n', [dict(a=1, seeds=[0])],
                 {'': drawn.append, '_probe': drawn.append})
    out = tmp_path / 'out'
    assert json.loads((out / 'study.json').read_text()) == dict(meta={}, runs=[1])
    assert (out / 'study.md').read_text() == '| a |\n' and (out / 'study.csv').read_text().split() == ['a', '1']
    assert drawn == [out / 'study.png', out / 'study_probe.png']
    write_report(tmp_path / 'bare', 'study', {}, '')
    assert sorted(p.name for p in (tmp_path / 'bare').iterdir()) == ['study.json', 'study.md']
