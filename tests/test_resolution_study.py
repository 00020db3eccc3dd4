"""The Fashion-MNIST loader and the classification resolution study, end to end on a tiny configuration."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_fmnist import write_idx

from benchmarks import resolution_study as study
from benchmarks.study import config as cfg
from benchmarks.study import data, report, specs, trainer
from cpvt_backbones.datasets import load_fashion_mnist, read_idx

VARIANTS = ['none', 'learned', 'peg_0-5']  # the paths: no encoding, a table (probe), PEGs (their response)
TINY = ['--train-images', '96', '--test-images', '40', '--epochs', '2', '--batch-size', '32', '--dim', '16',
        '--depth', '6', '--heads', '2', '--image-size', '28', '--patch', '4', '--test-sizes', '28', '40',
        '--placement-canvas', '36', '--placement-images', '20', '--probe-images', '10', '--canvas-sizes', '40',
        '--variants'] + VARIANTS


def render(x: torch.Tensor, key: str, config) -> torch.Tensor:
    """The input of the test a stored key names."""
    return specs.parse_key(key).render(x, config)


def test_loader_reads_gzipped_and_plain_idx(fake_fmnist):
    x, y = load_fashion_mnist('train', fake_fmnist)
    assert x.shape == (160, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
    x_test, _ = load_fashion_mnist('test', fake_fmnist)
    assert x_test.shape == (48, 28, 28)
    assert (x[np.arange(160), 2 * y + 4, 10] == 255).all()


def test_loader_errors_name_the_problem(tmp_path, fake_fmnist):
    with pytest.raises(FileNotFoundError, match='apt-get install dataset-fashion-mnist'):
        load_fashion_mnist('train', tmp_path / 'missing')
    with pytest.raises(FileNotFoundError, match='train-images-idx3-ubyte'):
        load_fashion_mnist('train', tmp_path)
    with pytest.raises(ValueError, match='split must be one of'):
        load_fashion_mnist('val', fake_fmnist)
    bad = tmp_path / 'bad-idx'
    bad.write_bytes(b'\x00\x00\x0d\x03' + b'\x00' * 12)
    with pytest.raises(ValueError, match='not an unsigned-byte IDX file with 3'):
        read_idx(bad, 3)
    short = tmp_path / 'short-idx'
    write_idx(short, np.zeros((2, 3, 3)), compress=False)
    short.write_bytes(short.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r'header says shape \(2, 3, 3\)'):
        read_idx(short, 3)


def test_study_stops_in_one_line_without_data(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r'not found in .*apt-get install dataset-fashion-mnist'):
        study.main(['--data', str(tmp_path)] + TINY)


def test_random_resized_crop_stays_inside_and_flips():
    x = torch.arange(28.).repeat(32, 1, 28, 1)  # value = column index
    gen = torch.Generator().manual_seed(0)
    out = data.random_resized_crop(x, 28, 1.0, gen)
    assert out.shape == (32, 1, 28, 28)
    assert out.min() >= 0 and out.max() <= 27
    steps = out[:, 0, 14].diff(dim=-1)
    rising, falling = (steps > 0).all(dim=-1), (steps < 0).all(dim=-1)
    assert (rising | falling).all() and rising.any() and falling.any()  # monotone rows, both flips seen
    small = data.random_resized_crop(x, 28, 0.25, gen)
    span = (small[:, 0, 14, -1] - small[:, 0, 14, 0]).abs()
    assert (span < 26).sum() > 16 and span.min() > 27 * 0.25 ** 0.5 * (3 / 4) ** 0.5 - 1  # zoomed, never a sliver


def test_antialiased_crop_of_the_whole_image_is_the_antialiased_resize():
    """The default crops resample as ImageNet pipelines do: a box covering the image gives exactly
    ``F.interpolate(antialias=True)`` (what PIL does), a whole-pixel box gives that of the cut-out crop
    (torchvision's RandomResizedCrop), flipped when the box says so; the aliased arm gives neither when it shrinks."""
    x = torch.randn(4, 2, 28, 28)
    whole = torch.tensor([[0., 0., 1., 1., 1.]]).repeat(4, 1)
    for size in (9, 14, 20, 42):
        reference = torch.nn.functional.interpolate(x, size=(size, size), mode='bilinear', align_corners=False,
                                                    antialias=True)
        torch.testing.assert_close(data.resample_boxes(x, whole, size, 'antialiased'), reference,
                                   atol=1e-5, rtol=1e-5)
    shrunk = data.resize(x, 14)
    assert (data.resample_boxes(x, whole, 14, 'aliased') - shrunk).abs().max() > 0.3
    flipped = whole.clone()
    flipped[:, 4] = -1
    torch.testing.assert_close(data.resample_boxes(x, flipped, 14, 'antialiased'), shrunk.flip(-1))
    left, width, top, height = 3, 20, 5, 16  # a whole-pixel box: centre and half-extent in -1..1 coordinates
    box = torch.tensor([[(left + width / 2) / 14 - 1, (top + height / 2) / 14 - 1, width / 28, height / 28, 1.]])
    crop = x[:1, :, top:top + height, left:left + width]
    for size in (14, 20):  # shrinking and enlarging
        reference = torch.nn.functional.interpolate(crop, size=(size, size), mode='bilinear', align_corners=False,
                                                    antialias=True)
        torch.testing.assert_close(data.resample_boxes(x[:1], box, size, 'antialiased'), reference,
                                   atol=1e-5, rtol=1e-5)
    gen = torch.Generator().manual_seed(0)
    boxes = data.random_boxes(64, 0.25, gen)
    crops = {m: data.resample_boxes(x.repeat(16, 1, 1, 1), boxes, 14, m) for m in data.CROP_RESAMPLE}
    assert all(torch.isfinite(c).all() for c in crops.values())
    assert (crops['antialiased'] - crops['aliased']).abs().mean() > 0.1  # same boxes, other resampling
    with pytest.raises(ValueError, match='crop resampling must be one of'):
        data.resample_boxes(x, whole, 14, 'nearest')


def test_recipe_options_reach_the_optimizer_and_the_tests():
    args = study.parse_args(TINY)
    model = trainer.build_model('peg_0-5', args)
    exempt = {n for n in model.no_weight_decay() if n.endswith('weight')}
    assert exempt, 'the PEG weights are exempt from weight decay by default'

    def decayed(args):
        opt, _ = trainer.make_optimizer(model, args, 10)
        ids = {id(p) for p in opt.param_groups[0]['params']}
        return {n for n, p in model.named_parameters() if id(p) in ids}
    assert not decayed(args) & exempt
    assert exempt <= decayed(study.parse_args(TINY + ['--decay-position']))
    bicubic = study.parse_args(TINY + ['--test-resample', 'bicubic', '--canvas-sizes', '40'])
    assert [t.key for t in specs.size_tests(bicubic)] == ['bicubic28', 'bicubic40', 'canvas40']
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(render(x, 'bicubic40', bicubic), torch.nn.functional.interpolate(
        x, size=(40, 40), mode='bicubic', align_corners=False))
    assert not torch.allclose(render(x, 'bicubic40', bicubic), render(x, '40', bicubic))
    assert study.parse_args(TINY + ['--name', 'b']).run_set == 'b'
    assert study.parse_args(TINY + ['--name', 'b', '--runs', 'a']).run_set == 'a'


def test_canvas_keeps_the_object_on_the_training_token_grid():
    args = study.parse_args(TINY)
    x = torch.randn(3, 1, 28, 28)
    out = render(x, 'canvas56', args)
    assert out.shape == (3, 1, 56, 56)
    assert torch.equal(out[..., 12:40, 12:40], x)  # 14 px each side, aligned down to the patch: 12
    border = torch.ones(56, 56, dtype=torch.bool)
    border[12:40, 12:40] = False
    assert torch.allclose(out[..., border], torch.tensor(-data.MEAN / data.STD))  # a black background
    assert render(x, 'place56@0,28', args)[..., :28, 28:].equal(x)
    assert render(x, '56', args).shape == (3, 1, 56, 56)
    assert render(x, '28', args) is x
    # a larger training size: the canvas holds the image at that size
    args = args.replace(image_size=40, test_sizes=(40,), canvas_sizes=(), placement_canvas=0)
    assert torch.equal(render(x, 'canvas56', args)[..., 8:48, 8:48], data.resize(x, 40))


def test_peg_response_sees_the_zero_padded_border():
    """On a blank image the first PEG's output is the same for every interior token and differs only where its
    3 x 3 window reaches the zero padding: the border ring that encodes absolute position."""
    args = study.parse_args(TINY)
    model = trainer.build_model('peg_0', args)
    with torch.no_grad():
        model.pos_block[0].proj[0].weight.normal_()
    response = trainer.peg_response(model, torch.full((1, 1, 56, 56), 1.5))
    assert response.shape == (14, 14)
    interior = response[1:-1, 1:-1]
    assert torch.allclose(interior, interior[0, 0].expand_as(interior), rtol=1e-4)
    ring = torch.cat([response[0], response[-1], response[:, 0], response[:, -1]])
    assert (ring - interior[0, 0]).abs().min() > 1e-3


def test_position_probe_reads_relative_position_from_a_learned_table():
    """A model whose tokens are just its interpolated position table carries relative position at every size:
    the probe finds it (R^2 near 1 at 1x and after resizing); without any position encoding it finds nothing."""
    args = study.parse_args(TINY)
    table = trainer.build_model('learned', args)
    blind = trainer.build_model('none', args)
    with torch.no_grad():
        for model in (table, blind):
            for block in model.blocks:
                for linear in (block.attn.proj, block.mlp.fc2):
                    linear.weight.zero_()
                    linear.bias.zero_()
            model.patch_embed.proj.weight.zero_()
        rows, cols = torch.meshgrid(torch.linspace(-1, 1, 7), torch.linspace(-1, 1, 7), indexing='ij')
        grid = table.pos_embed.table(0)
        grid.zero_()
        grid[0, 1:, :2] = torch.stack((rows, cols), dim=-1).reshape(49, 2)
        grid[0, 1:, 2] = 10.  # a large constant keeps the final LayerNorm nearly linear
    x = torch.randn(8, 1, 28, 28)
    learned, none = trainer.position_probe(table, x, args), trainer.position_probe(blind, x, args)
    assert learned['r2']['28'] > 0.99 and learned['r2']['40'] > 0.95
    assert abs(none['r2']['28']) < 0.05
    assert learned['true_rows']['40'] == [round((i + 0.5) / 10, 4) for i in range(10)]


def test_bad_settings_are_refused(capsys):
    for bad, message in ((['--test-sizes', '30'], 'not a multiple of the patch size'),
                         (['--test-sizes', '56'], 'must include the training size'),
                         (['--canvas-sizes', '28'], 'must be larger than the training size'),
                         (['--placement-canvas', '42'], 'not a multiple of the patch size'),
                         (['--crop-scale', '0'], 'crop_scale must be in (0, 1]'),
                         (['--depth', '4'], 'peg_0-5 needs depth >= 6'),
                         (['--shard', '2/2'], '--shard must be K/N')):
        with pytest.raises(SystemExit):
            study.parse_args(['--image-size', '28', '--patch', '4', '--test-sizes', '28'] + bad)
        assert message in capsys.readouterr().err


def test_variants_differ_only_in_position_encoding():
    args = study.parse_args(TINY)
    models = {v: trainer.build_model(v, args) for v in cfg.VIT_VARIANTS}
    keys = {v: set(m.state_dict()) for v, m in models.items()}
    common = keys['none']
    assert all(keys[v] >= common for v in keys)
    roots = {v: {k.split('.')[0] for k in keys[v] - common} for v in keys}
    assert roots == {'none': set(), 'learned': {'pos_embed'}, 'sincos': set(), 'rpe': {'rel_pos'},
                     'peg_-1': {'pos_block'}, 'peg_-1_wide': {'pos_block'}, 'peg_0': {'pos_block'},
                     'peg_0-5': {'pos_block'}, 'peg_0-5_circular': {'pos_block'}, 'peg_frozen': {'pos_block'},
                     'peg_qk': {'pos_qk'},
                     'conv1x1': {'pos_block'}, 'learned+peg_0': {'pos_embed', 'pos_block'}, 'rope_axial': set(),
                     'rope_mixed': {'rope'}, 'rope_mixed+peg_0': {'rope', 'pos_block'}}
    assert len({k for k in keys['peg_0-5'] - common if k.endswith('weight')}) == 6
    assert models['peg_-1'].pos_block.peg_after == {(0, -1): 0}
    assert models['peg_-1_wide'].pos_block[0].proj[0].kernel_size == (13, 13)  # 2 * 7 - 1 on the 7 x 7 grid
    assert models['conv1x1'].pos_block[0].proj[0].kernel_size == (1, 1) and len(models['conv1x1'].pos_block) == 6
    assert not any(p.requires_grad for p in models['peg_frozen'].pos_block.parameters())
    assert models['learned'].pos_embed.table(0).shape == (1, 1 + 7 * 7, 16)
    assert models['rope_axial'].pos_encoding_attrs == ('rope',) and models['sincos'].pos_encoding_attrs
    gap = trainer.build_model('peg_0', study.parse_args(TINY + ['--head', 'gap']))
    assert gap.cls_token is None and gap.pos_block[0].num_prefix_tokens == 0


def test_the_cnn_control_runs_the_same_protocol(tmp_path, fake_fmnist, capsys):
    """The positive control: a CNN on the same token grid with no position encoding, GAP only, through the same
    training, tests and position probe."""
    argv = ['--data', str(fake_fmnist), '--work-dir', str(tmp_path / 'w'), '--out', str(tmp_path / 'o'),
            '--seeds', '0'] + TINY[:-len(VARIANTS)] + ['cnn', '--head', 'gap']
    model = trainer.build_model('cnn', study.parse_args(argv))
    assert not any('pos' in k for k in model.state_dict()) and model.num_prefix_tokens == 0
    for size in (28, 40, 9):
        assert model.eval()(torch.randn(2, 1, size, size)).shape == (2, 10)
    assert model.forward_features(torch.randn(2, 1, 40, 40)).shape == (2, 10 * 10, 16)
    rows = study.main(argv)
    assert {(r['variant'], r['test'], r['size']) for r in rows} == {
        ('cnn', 'resize', 28), ('cnn', 'resize', 40), ('cnn', 'canvas', 40)}
    with pytest.raises(SystemExit):
        study.parse_args(argv[:-2])  # the class-token head
    assert 'variant cnn pools its feature map' in capsys.readouterr().err


def test_study_end_to_end_then_resume(tmp_path, fake_fmnist, monkeypatch):
    work, out = tmp_path / 'work', tmp_path / 'out'
    argv = ['--data', str(fake_fmnist), '--work-dir', str(work), '--out', str(out), '--seeds', '0', '1'] + TINY

    rows = study.main(argv)
    assert len(rows) == len(VARIANTS) * 3
    assert {(r['test'], r['size']) for r in rows} == {('resize', 28), ('resize', 40), ('canvas', 40)}
    for row in rows:
        assert len(row['top1_per_seed']) == 2
        assert row['top1_std'] == pytest.approx(float(np.std(row['top1_per_seed'], ddof=1)), abs=0.01)
        assert 0 <= row['top1_mean'] <= 100
    saved = json.loads((out / 'resolution_study.json').read_text())
    assert saved['meta']['seeds'] == [0, 1] and saved['meta']['iterations'] == 2 * (96 // 32)
    assert saved['meta']['command'].startswith('python -m benchmarks.resolution_study --data')
    assert {r['variant'] for r in saved['runs']} == set(VARIANTS)
    assert (out / 'resolution_study.png').stat().st_size > 10_000
    assert [(p['top'], p['left']) for p in saved['placement'][:9]] == [(r, c) for r in (0, 4, 8) for c in (0, 4, 8)]
    assert len(saved['placement']) == len(VARIANTS) * 9
    assert all(len(p['top1_per_seed']) == 2 for p in saved['placement'])
    assert all(r['top1'][key] * 20 % 100 == 0 for r in saved['runs'] for key in r['top1'] if key.startswith('place'))
    assert [(p['variant'], p['size']) for p in saved['probe']] == [(v, s) for v in VARIANTS for s in (28, 40)]
    assert all(p['r2_mean'] <= 1 and len(p['predicted_rows']) == p['size'] // 4 for p in saved['probe'])
    for figure in ('placement', 'peg_response', 'probe'):
        assert (out / f'resolution_study_{figure}.png').stat().st_size > 10_000
    assert '±' in (out / 'resolution_study.md').read_text()
    assert saved['meta']['trained_on'] == 'cpu' and 'iterations) on cpu;' in (out / 'resolution_study.md').read_text()

    # A rerun skips every finished run, and a test added later runs on the saved weights of every finished
    # run, without training.
    monkeypatch.setattr(trainer, 'train', lambda *a: pytest.fail('a finished run was trained again'))
    assert study.main(argv) == rows
    more = study.main(argv + ['--canvas-sizes', '40', '48'])
    assert [r for r in more if (r['test'], r['size']) != ('canvas', 48)] == rows
    assert len(more) == len(VARIANTS) * 4
    assert all('canvas48' in json.loads((work / 'resolution_study' / f'{v}-seed1' / 'result.json').read_text())['top1']
               for v in VARIANTS)
    monkeypatch.undo()

    # A run whose weights are gone is trained again for a test it lacks (here a test-only variant sharing the
    # runs), and every earlier test of its result runs again on the new weights: the result keeps them all,
    # each from the one training (seeded, so equal to the first training's).
    gone = work / 'resolution_study' / 'none-seed1'
    before = json.loads((gone / 'result.json').read_text())['top1']
    (gone / 'final.pth').unlink()
    study.main(argv + ['--canvas-sizes', '40', '48', '--test-resample', 'bicubic'])
    after = json.loads((gone / 'result.json').read_text())['top1']
    assert {k: after[k] for k in before} == before and any(k.startswith('bicubic') for k in after)

    # Interrupted after its first epoch, a run resumes from its checkpoint and ends bitwise where an
    # uninterrupted run ends (data order, augmentation and drop path all continue their random streams).
    args = study.parse_args(argv)
    splits = (data.load_split(args.data, 'train', 96), data.load_split(args.data, 'test', 40))
    resumed = tmp_path / 'resumed'
    real_write = trainer.atomic_write

    def write_then_crash(path, write):
        real_write(path, write)
        raise KeyboardInterrupt
    monkeypatch.setattr(trainer, 'atomic_write', write_then_crash)
    with pytest.raises(KeyboardInterrupt):
        trainer.run('peg_0-5', 0, args, splits, resumed)
    monkeypatch.undo()
    assert torch.load(resumed / 'checkpoint.pth', weights_only=False)['state']['epoch'] == 1
    result = trainer.run('peg_0-5', 0, args, splits, resumed)
    reference = json.loads((work / 'resolution_study' / 'peg_0-5-seed0' / 'result.json').read_text())
    assert result['top1'] == {k: reference['top1'][k] for k in result['top1']}
    assert [e['loss'] for e in result['log']] == [e['loss'] for e in reference['log']]
    final = torch.load(resumed / 'final.pth')
    uninterrupted = torch.load(work / 'resolution_study' / 'peg_0-5-seed0' / 'final.pth')
    assert all(torch.equal(final[k], uninterrupted[k]) for k in uninterrupted)


def test_a_study_over_runs_from_two_devices_says_which_trained_where():
    runs = [dict(variant='none', seed=0, device='cuda'), dict(variant='peg_0', seed=0, device='cpu'),
            dict(variant='none', seed=1, device='cuda')]
    assert report.trained_on(runs) == 'cuda (2 runs: none seed 0, none seed 1) and cpu (1 run: peg_0 seed 0)'
    assert report.trained_on(runs[:1]) == 'cuda'


def test_tf32_is_set_for_the_block_recorded_and_restored():
    """``--tf32``: off and on set CUDA matrix products and cuDNN convolutions alike, the default leaves PyTorch's
    settings (cuDNN's TF32 on, the matrix products' off); every setting comes back afterwards, after an error
    too."""
    def flags():
        return trainer.fp32_precision('default').__enter__()
    before = flags()
    assert before == dict(matmul='ieee', cudnn_conv='tf32')   # PyTorch's defaults
    with trainer.fp32_precision('off') as in_force:
        assert in_force == flags() == dict(matmul='ieee', cudnn_conv='ieee')
    with pytest.raises(RuntimeError, match='inside'), trainer.fp32_precision('on') as in_force:
        assert in_force == flags() == dict(matmul='tf32', cudnn_conv='tf32')
        raise RuntimeError('inside')
    assert flags() == before
    with pytest.raises(ValueError, match="tf32 must be one of .* got 'half'"), trainer.fp32_precision('half'):
        pass


def test_a_config_is_checked_and_written_back_as_its_command_line():
    """``StudyConfig`` refuses what the study cannot run whichever way it is made; ``command_args`` gives the
    options that rebuild it; ``parse_fields`` reads typed FIELD=VALUE pairs."""
    for bad, message in ((dict(variants=('nope',)), "unknown variant(s) ['nope']"),
                         (dict(head='cls', variants=('cnn',)), 'variant cnn pools its feature map'),
                         (dict(tf32='half'), 'tf32 must be one of'),
                         (dict(seeds=()), 'at least one variant and one seed'),
                         (dict(shard_index=2, num_shards=2), 'shard must be K/N')):
        with pytest.raises(ValueError, match=re.escape(message)):
            cfg.StudyConfig(**bad)
    config = cfg.StudyConfig().replace(variants=('learned', 'cnn'), head='gap', lr=2e-3, test_sizes=(14, 28),
                                      decay_position=True, shard_index=1, num_shards=3, runs='shared')
    assert study.parse_args(cfg.command_args(config)) == config
    assert cfg.command_args(cfg.StudyConfig()) == []
    assert cfg.parse_fields(['lr=2e-3', 'test_sizes=14,28', 'decay_position=true', 'data=/d']) == dict(
        lr=2e-3, test_sizes=(14, 28), decay_position=True, data=Path('/d'))
    for bad in ('lr', 'nope=1', 'epochs=x', 'decay_position=maybe'):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            cfg.parse_fields([bad])


def test_test_specifications_round_trip_their_stored_keys():
    for key, test in (('28', specs.Resized(28)), ('bicubic28', specs.Resized(28, 'bicubic')),
                      ('canvas40', specs.OnCanvas(40)), ('place56@0,28', specs.OnCanvasAt(56, 0, 28)),
                      ('given56', specs.Given(56)), ('native96', specs.Drawn(96)),
                      ('upsampled96', specs.DrawnResized(96))):
        assert specs.parse_key(key) == test and test.key == key
    config56 = cfg.StudyConfig().replace(image_size=56, test_sizes=(56,))
    drawn = torch.randn(2, 3, 56, 56)
    assert specs.Drawn(56).render(drawn, config56) is drawn
    assert specs.DrawnResized(96).render(drawn, config56).shape[-2:] == (96, 96)
    with pytest.raises(ValueError, match=r'native80: the images are \(56, 56\), not 80 x 80'):
        specs.Drawn(80).render(drawn, config56)
    with pytest.raises(ValueError, match='given56: the images are'):
        specs.DrawnResized(96).render(torch.randn(2, 3, 40, 40), config56)
    for bad in ('x28', 'bilinear28', 'place56', ''):
        with pytest.raises(ValueError, match='not a test key'):
            specs.parse_key(bad)
    config = study.parse_args(TINY)
    assert [t.key for t in specs.study_tests(config)] == ['28', '40', 'canvas40'] + [
        f'place36@{r},{c}' for r in (0, 4, 8) for c in (0, 4, 8)]
