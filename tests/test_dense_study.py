"""The dense resolution study end to end on a tiny configuration: five backbones, both tasks, resized and drawn
test sizes, shards."""
import json

import pytest

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')
from mmengine.registry import DefaultScope  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from benchmarks.dense_study import cli, design, render  # noqa: E402


def test_variants_build_the_backbones_they_name(tmp_path):
    """Same widths, depths and heads; mmdet's PVT v1 keeps its learned table for the training scale."""
    args = cli.parse_args(['--data', str(tmp_path / 'shapes')])
    from mmdet.registry import MODELS

    import cpvt_backbones.adapters.mmdet  # noqa: F401  (registers PyramidCPVT)
    with DefaultScope.overwrite_default_scope('mmdet'):
        built = {}
        for variant in design.VARIANTS:
            cfg, iters = design.make_config('detection', variant, 0, args, tmp_path / variant)
            assert iters == 300 and cfg.train_cfg.max_iters == 300 and cfg.resume
            built[variant] = MODELS.build(cfg.model.backbone)
    assert type(built['pvt']).__name__ == 'PyramidVisionTransformer'
    assert type(built['peg']).__name__ == type(built['none']).__name__ == 'PyramidCPVT'
    assert len(built['peg'].pos_block) == 4 and built['none'].pos_encoding_attrs == ()
    tables = [n for n, _ in built['pvt'].named_parameters() if n.endswith('pos_embed')]
    assert len(tables) == 4
    assert dict(built['pvt'].named_parameters())[tables[0]].shape == (1, 48 * 48, 32)  # 192 px / 4
    assert [stage[0].projection.out_channels for stage in built['pvt'].layers] == [32, 64, 160, 256]
    assert [len(stage[1]) for stage in built['pvt'].layers] == [3] * 4  # the table, then 2 blocks
    n_peg, n_none = (sum(p.numel() for p in built[v].parameters()) for v in ('peg', 'none'))
    assert n_peg - n_none == 9 * (32 + 64 + 160 + 256) + (32 + 64 + 160 + 256)  # 3x3 depthwise + bias
    assert built['learned'].pos_embed.table(0).shape == (1, 48 * 48, 32)  # ours, for the same 192 px scale
    assert built['rope_mixed'].pos_encoding_attrs == ('rope',) and len(built['rope_mixed'].rope.freqs) == 8
    assert cli.parse_args([]).variants == design.STUDIED   # the SVTs only when asked for
    assert type(built['svt']).__name__ == 'TwinsSVT' and built['svt'].embed_dims == built['peg'].embed_dims
    masks = {v: {m.window_mask for m in built[v].modules() if hasattr(m, 'window_mask')}
             for v in ('svt', 'svt_unmasked')}
    assert masks == {'svt': {True}, 'svt_unmasked': {False}}


def test_segmentor_starts_from_the_detector_backbone_strictly(tmp_path):
    """The detector's backbone weights carry over whole (PVT's table included), a missing detector says what
    to run, and weights that do not fit raise instead of being skipped as mmdet's PVT would."""
    import torch
    from mmdet.registry import MODELS

    import cpvt_backbones.adapters.mmdet  # noqa: F401
    args = cli.parse_args(['--data', str(tmp_path / 'shapes')])
    for variant in ('pvt', 'peg'):
        det_cfg, _ = design.make_config('detection', variant, 0, args, tmp_path / 'det')
        with DefaultScope.overwrite_default_scope('mmdet'):
            detector_backbone = MODELS.build(det_cfg.model.backbone)
        detector = tmp_path / f'{variant}.pth'
        torch.save(dict(state_dict={f'backbone.{k}': v for k, v in detector_backbone.state_dict().items()}),
                   detector)
        cfg, _ = design.make_config('segmentation', variant, 0, args, tmp_path / 'seg')
        design.start_from_detector(cfg, detector, tmp_path / variant / 'backbone.pth')
        saved = torch.load(cfg.model.backbone.init_cfg['checkpoint'])
        assert saved.keys() == detector_backbone.state_dict().keys()
        assert all(torch.equal(saved[k], v) for k, v in detector_backbone.state_dict().items())

    with pytest.raises(FileNotFoundError, match='--seg-init scratch'):
        design.start_from_detector(cfg, tmp_path / 'missing.pth', tmp_path / 'x.pth')
    cfg, _ = design.make_config('segmentation', 'pvt', 0, args, tmp_path / 'seg')
    cfg.model.backbone.pretrain_img_size = 160  # a 40 x 40 table cannot take the detector's 48 x 48 one
    with pytest.raises(RuntimeError, match='pos_embed'):
        design.start_from_detector(cfg, tmp_path / 'pvt.pth', tmp_path / 'y.pth')


@pytest.mark.heavy
def test_dense_study_end_to_end_then_skips(tmp_path, monkeypatch):
    variants = ['peg', 'pvt']  # ours and mmdet's: the two code paths (the five build in the test above)
    argv = ['--data', str(tmp_path / 'shapes'), '--num-train', '8', '--num-val', '2', '--det-iters', '2',
            '--seg-iters', '2', '--seeds', '0', '--factors', '0.5', 'native', 'drawn2', '--variants', *variants,
            '--work-dir', str(tmp_path / 'work'), '--out', str(tmp_path / 'out')]
    with DefaultScope.overwrite_default_scope('mmdet'):  # the study's Runners leave their scopes behind otherwise
        assert cli.main(argv + ['--shard', '0/2']) == []   # the other shard's runs are pending: no outputs
        assert not (tmp_path / 'out').exists()
        rows = cli.main(argv + ['--shard', '1/2'])
    assert len(rows) == 2 * len(variants) * 3
    drawn = json.loads((tmp_path / 'shapes_drawn' / '384' / 'annotations' / 'val.json').read_text())
    assert max(max(i['height'], i['width']) for i in drawn['images']) == 384  # detection: 2 x 192 px
    assert all(0 <= r['mean'] <= 100 and r['per_seed'] == [r['mean']] for r in rows)
    saved = json.loads((tmp_path / 'out' / 'dense_study.json').read_text())
    assert {(r['task'], r['variant']) for r in saved['runs']} == {(t, v) for t in design.TASKS for v in variants}
    assert saved['meta']['command'].startswith('python -m benchmarks.dense_study --data')
    assert (tmp_path / 'out' / 'dense_study.png').read_bytes()[:4] == b'\x89PNG'
    text = (tmp_path / 'out' / 'dense_study.md').read_text()
    assert 'native' in text and text.count('Paired by seed, minus pcpvt_tiny (PEG)') == 2   # one table per task
    assert all((tmp_path / 'work' / f'segmentation-{v}-seed0' / 'backbone_from_detector.pth').is_file()
               for v in variants)

    monkeypatch.setattr(Runner, 'from_cfg', classmethod(lambda *a, **k: pytest.fail('a finished run ran again')))
    with DefaultScope.overwrite_default_scope('mmdet'):
        assert cli.main(argv) == rows
    import cpvt_backbones.adapters.evaluation as evaluation  # run() imports evaluate from here at each call
    calls = []
    monkeypatch.setattr(evaluation, 'evaluate',
                        lambda *a, **k: calls.append(a[-1]) or {'coco/bbox_mAP': .5, 'mIoU': 50.})
    with DefaultScope.overwrite_default_scope('mmdet'):  # a test added later runs on the saved weights only
        rows = cli.main(argv + ['--variants', 'peg', '--factors', '0.5', 'drawn1'])
    assert calls == ['drawn1x', 'drawn1x'] and len(rows) == 2 * 2


def test_paired_differences_from_the_first_variant():
    """Each later variant minus the first, paired by seed, at 1x and on the per-seed mean over the resized sizes."""
    settings = cli.parse_args(['--variants', 'svt', 'svt_unmasked', '--factors', '1', '2', 'native'])
    values = {('svt', '1'): [20., 22., 24.], ('svt_unmasked', '1'): [21., 23., 25.5],
              ('svt', '2'): [10., 10., 10.], ('svt_unmasked', '2'): [10., 12., 8.]}
    rows = [dict(task=task, variant=v, factor=f, per_seed=values.get((v, f), [0., 0., 0.]))
            for task in design.TASKS for v in ('svt', 'svt_unmasked') for f in ('1', '2', 'native')]
    cells = render.paired_differences(rows, 'detection', settings)['svt_unmasked']
    assert cells['1x']['mean'] == 1.17 and cells['1x']['sign'] == '+'   # +1, +1, +1.5: the interval excludes 0
    assert cells['resized mean']['mean'] == 0.58 and cells['resized mean']['sign'] == '='
    assert render.paired_differences(rows, 'detection', cli.parse_args(['--variants', 'svt'])) == {}


def test_recorded_runs_are_reported_without_training_once_every_shard_is_done(tmp_path, monkeypatch):
    """Every run's record there (each task of each (seed, variant)): the report comes from the records alone; a run
    of the other shard missing holds it back."""
    monkeypatch.setattr(design, 'make_config', lambda *a, **k: pytest.fail('a recorded run was run again'))
    argv = ['--data', str(tmp_path / 'shapes'), '--num-train', '4', '--num-val', '2', '--variants', 'peg', 'pvt',
            '--seeds', '0', '1', '--factors', '1', '2', '--work-dir', str(tmp_path / 'work'), '--out',
            str(tmp_path / 'out')]
    runs = [dict(task=t, variant=v, seed=s, iterations=1, scores={'1': 10. * s + i, '2': 5. + s},
                 train_seconds=60., eval_seconds=30.) for s in (0, 1) for i, v in enumerate(('peg', 'pvt'))
            for t in design.TASKS]
    for r in runs:
        path = tmp_path / 'work' / f'{r["task"]}-{r["variant"]}-seed{r["seed"]}' / 'result.json'
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(r))
    (tmp_path / 'work' / 'segmentation-pvt-seed1' / 'result.json').unlink()   # the (1, pvt) pair: shard 1 of 2
    assert cli.main(argv + ['--shard', '0/2']) == [] and not (tmp_path / 'out').exists()
    (tmp_path / 'work' / 'segmentation-pvt-seed1' / 'result.json').write_text(json.dumps(runs[-1]))
    rows = cli.main(argv + ['--shard', '0/2'])
    assert [(r['task'], r['variant'], r['factor'], r['per_seed']) for r in rows][:4] == [
        ('detection', 'peg', '1', [0., 10.]), ('detection', 'peg', '2', [5., 6.]),
        ('detection', 'pvt', '1', [1., 11.]), ('detection', 'pvt', '2', [5., 6.])]
    saved = json.loads((tmp_path / 'out' / 'dense_study.json').read_text())
    assert saved['runs'] == runs and saved['meta']['run_minutes'] == 12.   # in grid order: seed, variant, task
    text = (tmp_path / 'out' / 'dense_study.md').read_text()
    assert '| mmdet PVT v1 (learned abs. PE, resized) | +1.00 [+1.00, +1.00] | +0.50 [+0.50, +0.50] |' in text
