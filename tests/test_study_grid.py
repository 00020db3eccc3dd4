"""The studies' shared run grid (``benchmarks.study.grid``): shards partition the runs, a run is done once its
result.json exists, the report waits for every shard, and the report's files are written as listed; a study's
invocation (``conduct``) and its runs one after another for one job (``pool.run_all``)."""
import json

import pytest

from benchmarks.study import pool
from benchmarks.study.grid import Grid, conduct, write_report


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


def test_conduct_works_this_shards_pending_runs_and_reports_once_all_are_done(tmp_path, capsys):
    def done(key):
        (tmp_path / f'run{key}').mkdir(exist_ok=True)
        (tmp_path / f'run{key}' / 'result.json').write_text('{}')
    grid = Grid([0, 1, 2, 3], lambda k: [tmp_path / f'run{k}'], 0, 2)   # this shard: 0 and 2
    done(2)
    worked, reports = [], []

    def work(todo):
        worked.append(todo)
        for key in todo:
            done(key)

    def load(key):
        return [dict(key=key, part=0), dict(key=key, part=1)]

    def report(results, meta):
        reports.append((results, meta))
        return 'written'
    args = (grid, 't', 'benchmarks.some_study', ['--seeds', '0 1'], work, load, report)
    assert conduct(*args) is None and worked == [[0]] and reports == []   # 1 and 3 belong to the other shard
    assert '2 run(s) of other shards pending (run1, run3)' in capsys.readouterr().out
    done(1), done(3)
    assert conduct(*args) == 'written' and worked == [[0]]   # nothing left to do here: work is not called
    (results, meta), = reports
    assert [(r['key'], r['part']) for r in results] == [(k, p) for k in range(4) for p in (0, 1)]
    assert meta['command'] == "python -m benchmarks.some_study --seeds '0 1'" and 'wall_minutes' in meta


def test_run_all_calls_one_after_another_here_for_one_job(monkeypatch, capsys):
    monkeypatch.setattr(pool, 'map_shared', lambda *a, **k: pytest.fail('one job needs no pool'))
    calls = []
    pool.run_all(lambda data, n, name: calls.append((data, n, name)) or name, [(2, 'b'), (1, 'a'), (3, 'c')],
                 'data', 1, 4, 't')
    assert calls == [('data', 2, 'b'), ('data', 1, 'a'), ('data', 3, 'c')]
