"""The native-detail study (benchmarks/native_detail.py): its classification scenes, drawings that carry real
detail at larger sizes, the paired statistics every study reports, and a tiny run end to end."""
import json
import math
import tempfile

import pytest
import torch

from cpvt_backbones.datasets import CLASSES, class_scenes
from benchmarks import native_detail
from benchmarks.study.data import resize
from benchmarks.study.common import format_paired, paired


def test_class_scenes_hold_shapes_of_their_class_only_and_are_deterministic():
    scenes, labels = class_scenes(40, 56, seed=3, objects=(2, 4), object_size=(0.12, 0.3))
    again, labels_again = class_scenes(40, 56, seed=3, objects=(2, 4), object_size=(0.12, 0.3))
    assert (labels == labels_again).all() and [s.shapes for s in scenes] == [s.shapes for s in again]
    assert sorted(set(labels.tolist())) == list(range(len(CLASSES)))
    assert [(labels == c).sum() for c in range(len(CLASSES))] == [10] * 4   # balanced
    for scene, label in zip(scenes, labels, strict=True):
        assert 1 <= len(scene.shapes) <= 4 and {s.cls_id for s in scene.shapes} == {int(label)}
        assert (scene.height, scene.width) == (56, 56)
        for shape in scene.shapes:
            assert 0.12 * 28 - 1e-9 <= shape.r <= 0.3 * 28 + 1e-9
    different, _ = class_scenes(40, 56, seed=4)
    assert [s.shapes for s in different] != [s.shapes for s in scenes]
    with pytest.raises(ValueError, match='objects'):
        class_scenes(4, 56, seed=0, objects=(3, 2))
    with pytest.raises(ValueError, match='object_size'):
        class_scenes(4, 56, seed=0, object_size=(0.2, 1.5))


def test_larger_drawings_carry_detail_that_upsampling_does_not():
    """A scene drawn at 48 px and shrunk to 28 px is closer to its 28 px drawing (the same scene, the same camera,
    other pixel noise) than the 28 px drawing upsampled to 48 px is to the 48 px drawing: the larger drawing has
    detail (sharper edges) that interpolation does not make; drawings made by upsampling would reverse this."""
    scenes, _ = class_scenes(16, 56, seed=0, objects=(2, 4), object_size=(0.12, 0.3))
    small, large = native_detail.draw(scenes, 56, 28), native_detail.draw(scenes, 56, 48)
    assert small.shape == (16, 3, 28, 28) and large.shape == (16, 3, 48, 48) and large.is_contiguous()
    down = (resize(large, 28) - small).abs().mean()
    up = (resize(small, 48) - large).abs().mean()
    assert down < 0.8 * up, (float(down), float(up))   # measured: 0.032 against 0.049


def test_paired_differences_and_their_interval():
    a, b = [1.0, 2.0, 3.5, 2.2, 0.1], [0.5, 1.9, 2.0, 2.5, -1.0]
    d = paired(a, b)
    diff = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(diff) / 5
    sd = math.sqrt(sum((v - mean) ** 2 for v in diff) / 4)
    half = 2.776 * sd / math.sqrt(5)     # Student's t, 4 degrees of freedom
    assert d == dict(mean=round(mean, 2), sd=round(sd, 2), lo=round(mean - half, 2), hi=round(mean + half, 2), n=5,
                     sign='=')
    assert format_paired(d) == f'{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]'
    assert paired([2.0, 3.0, 2.5], [1.0, 1.5, 1.2])['sign'] == '+'
    assert paired([1.0, 1.5, 1.2], [2.0, 3.0, 2.5])['sign'] == '-'
    assert paired([3.0], [1.0]) == dict(mean=2.0, sd=0., lo=None, hi=None, n=1, sign='=')
    assert format_paired(paired([3.0], [1.0])) == '+2.00'
    with pytest.raises(ValueError, match='equally long'):
        paired([1.0, 2.0], [1.0])


def test_a_tiny_native_detail_study_end_to_end(tmp_path):
    argv = ['--train-images', '128', '--test-images', '12', '--epochs', '1', '--variants', 'none', 'cnn',
            '--seeds', '0', '1', '--work-dir', str(tmp_path / 'runs'), '--out', str(tmp_path / 'out')]
    summary = native_detail.main(argv)
    keys = native_detail.test_keys()
    assert [(r['variant'], r['test']) for r in summary['rows']] == [(v, k) for v in ('none', 'cnn') for k in keys]
    assert [(p['a'], p['b']) for p in summary['pairs']] == [('none', 'cnn')] * len(keys)
    saved = json.loads((tmp_path / 'out' / 'native_detail.json').read_text())
    assert saved['meta']['trained_on'] == 'cpu' and len(saved['runs']) == 4
    for run in saved['runs']:
        assert set(run['top1']) == set(keys) and all(0 <= v <= 100 for v in run['top1'].values())
    text = (tmp_path / 'out' / 'native_detail.md').read_text()
    assert '| CNN, no position encoding (control) |' in text and '| none − cnn |' in text
    assert (tmp_path / 'out' / 'native_detail.png').stat().st_size > 0
    # a second invocation trains nothing again: it reads every run's result
    before = {r['variant'] + str(r['seed']): r['train_seconds'] for r in saved['runs']}
    native_detail.main(argv)
    again = json.loads((tmp_path / 'out' / 'native_detail.json').read_text())
    assert {r['variant'] + str(r['seed']): r['train_seconds'] for r in again['runs']} == before
    assert torch.load(tmp_path / 'runs' / 'native_detail' / 'cnn-seed0' / 'final.pth')


def test_drawing_in_chunks_gives_the_same_images(monkeypatch):
    """``draw`` renders a set in chunks (the 2x renders of a whole training set would not fit in memory): the
    images do not depend on the chunk size."""
    scenes, _ = class_scenes(7, 56, seed=2)
    whole = native_detail.draw(scenes, 56, 20)
    monkeypatch.setattr(native_detail, 'DRAW_CHUNK', 3)
    assert torch.equal(native_detail.draw(scenes, 56, 20), whole)


def test_runs_spread_over_processes_equal_runs_in_one(tmp_path, monkeypatch):
    """``--jobs 2``: the drawing spread over two processes and two runs trained at once from one memory-mapped
    copy of the drawn images give the results of one process; a GPU's TF32 is off by default and recorded."""
    argv = ['--train-images', '128', '--test-images', '12', '--epochs', '1', '--variants', 'cnn', '--seeds', '0', '1',
            '--out', str(tmp_path / 'out')]
    (tmp_path / 'tmp').mkdir()
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path / 'tmp'))
    native_detail.main(argv + ['--work-dir', str(tmp_path / 'one')])
    native_detail.main(argv + ['--work-dir', str(tmp_path / 'two'), '--jobs', '2'])
    for seed in (0, 1):
        one, two = (json.loads((tmp_path / d / 'native_detail' / f'cnn-seed{seed}' / 'result.json').read_text())
                    for d in ('one', 'two'))
        assert two['top1'] == one['top1'] and [e['loss'] for e in two['log']] == [e['loss'] for e in one['log']]
        assert two['tf32'] == dict(matmul='ieee', cudnn_conv='ieee')
    assert not list((tmp_path / 'tmp').glob('native_detail-*'))   # the shared copy is removed
