"""The OpenMMLab adapters: registration, building from config dicts, strict Pretrained loading."""
import copy
import importlib
import subprocess
import sys

import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.convert import CheckpointMismatchError
from cpvt_backbones.deploy import EngineRequest

for _framework in ('mmengine', 'mmdet', 'mmseg', 'mmpretrain'):
    pytest.importorskip(_framework)
FRAMEWORKS = ['mmdet', 'mmseg', 'mmpretrain']


def _build(framework, cfg):
    """Build as that framework's Runner would: its adapter imported, its scope the default."""
    from mmengine.registry import DefaultScope
    importlib.import_module(f'cpvt_backbones.adapters.{framework}')
    with DefaultScope.overwrite_default_scope(framework):
        return importlib.import_module(f'{framework}.registry').MODELS.build(cfg)


@pytest.mark.parametrize('framework', FRAMEWORKS)
def test_registered_and_built_from_config(framework):
    fw = framework
    importlib.import_module(f'{framework}.models')  # their own PCPVT/SVT registrations must not clash
    pyr = _build(fw, dict(type='PyramidCPVT', arch='pcpvt_tiny', out_indices=(1, 2, 3), drop_path_rate=0.1,
                            frozen_stages=1))
    outs = pyr(torch.randn(2, 3, 50, 75))
    assert [tuple(o.shape) for o in outs] == [(2, 64, 7, 10), (2, 160, 4, 5), (2, 256, 2, 3)]
    assert not pyr.patch_embeds[0].proj.weight.requires_grad and pyr.blocks[1][0].attn.q.weight.requires_grad
    assert pyr.blocks[-1][-1].drop_path.drop_prob == pytest.approx(0.1)
    pegs = dict(type='peg', positions=(0, 1))
    col = _build(fw, dict(type='CPVT', arch=dict(base='cpvt_tiny_gap', depth=4, pos_encoding=pegs),
                            out_indices=(0, 3), with_cp=True))
    assert len(col.blocks) == 4 and len(col.pos_block) == 2 and col.grad_checkpointing
    assert [tuple(o.shape) for o in col(torch.randn(1, 3, 50, 75))] == [(1, 48, 13, 19), (1, 192, 2, 3)]


def test_every_family_gets_its_registered_backbone(monkeypatch):
    """One OpenMMLab backbone per family of MODEL_SPECS, made from the specs alone: the registered classes, their
    default ``arch`` (the spec marked ``default``), pickling by name, and a new family (a subclass with one named
    size) getting its backbone without a line of adapter code."""
    import pickle

    from cpvt_backbones.adapters import backbones
    from cpvt_backbones.models import MODEL_SPECS, ModelSpec, PyramidCPVT
    assert list(backbones.BACKBONES) == ['PyramidCPVT', 'TwinsSVT', 'CPVT', 'PVTv2']
    for framework in FRAMEWORKS:
        importlib.import_module(f'cpvt_backbones.adapters.{framework}')
        registry = importlib.import_module(f'{framework}.registry').MODELS
        assert all(registry.get(name) is cls for name, cls in backbones.BACKBONES.items())
    assert {name: cls.__init__.__defaults__[0] for name, cls in backbones.BACKBONES.items()} == {
        'PyramidCPVT': 'pcpvt_small', 'TwinsSVT': 'svt_small', 'CPVT': 'cpvt_small_gap', 'PVTv2': 'pvt_v2_b2'}
    tiny = backbones.BACKBONES['PyramidCPVT']('pcpvt_tiny')
    assert type(pickle.loads(pickle.dumps(tiny))) is backbones.PyramidCPVT

    class Narrow(PyramidCPVT):
        pass
    monkeypatch.setitem(MODEL_SPECS, 'narrow_tiny', ModelSpec(Narrow, dict(MODEL_SPECS['pcpvt_tiny'].settings),
                                                              default=True))
    made = backbones._backbone_classes()
    assert list(made)[-1] == 'Narrow' and issubclass(made['Narrow'], (backbones._OpenMMLabBackbone, Narrow))
    out = made['Narrow'](out_indices=(3,))(torch.randn(1, 3, 33, 47))
    assert [tuple(o.shape) for o in out] == [(1, 256, 2, 2)]
    monkeypatch.setitem(MODEL_SPECS, 'narrow_small', ModelSpec(Narrow, {}, default=True))
    with pytest.raises(RuntimeError, match=r"Narrow: exactly one of \['narrow_tiny', 'narrow_small'\] must be"):
        backbones._backbone_classes()


def test_arch_as_full_settings_dict():
    fw = 'mmdet'
    arch = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), mlp_ratios=(2, 2, 2, 2),
                sr_ratios=(8, 4, 2, 1), pos_encoding=dict(type='peg', kernel_size=5))
    model = _build(fw, dict(type='PyramidCPVT', arch=arch))
    assert model.out_channels == (16, 32, 48, 64) and model.pos_block[2].proj[0].kernel_size == (5, 5)


@pytest.mark.parametrize('cfg, error, match', [
    (dict(arch='pcpvt_huge'), ValueError, 'valid names'),
    (dict(arch='cpvt_tiny'), ValueError, 'not a PyramidCPVT one'),
    (dict(arch=dict(base='pcpvt_tiny', depth=3)), TypeError, r"no argument\(s\) \['depth'\]"),
    (dict(arch=dict(base='pcpvt_tiny', drop_path_rate=0.1)), ValueError, 'set them next to arch'),
    (dict(out_type='pooled', out_indices=(3,)), ValueError, 'leave out_indices unset'),
    (dict(out_type='tokens'), ValueError, 'out_type'),
    (dict(out_indices=(4,)), ValueError, 'out_indices'),
    (dict(init_cfg=dict(type='Kaiming')), ValueError, "type='Pretrained'"),
    (dict(init_cfg=dict(type='Pretrained', path='x')), ValueError, 'checkpoint'),
    (dict(style='pytorch'), TypeError, 'style'),
])
def test_bad_configs(cfg, error, match):
    fw = 'mmdet'
    with pytest.raises(error, match=match):
        _build(fw, dict(type='PyramidCPVT', **{'arch': 'pcpvt_tiny', **cfg}))


def _classifier_weights(tmp_path):
    torch.manual_seed(3)
    sd = create_model('pcpvt_tiny').state_dict()
    path = tmp_path / 'pcpvt_tiny_in1k.pth'
    torch.save({'model': sd}, path)
    return sd, path


def test_pretrained_loads_strictly_through_detector(tmp_path):
    """init_cfg on the backbone of a whole RetinaNet: the detector's init_weights reaches our loader."""
    fw = 'mmdet'
    sd, path = _classifier_weights(tmp_path)
    det = _build(fw, dict(
        type='RetinaNet',
        data_preprocessor=dict(type='DetDataPreprocessor', pad_size_divisor=32),
        backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path))),
        neck=dict(type='FPN', in_channels=[32, 64, 160, 256], out_channels=32, start_level=1,
                  add_extra_convs='on_input', num_outs=5),
        bbox_head=dict(type='RetinaHead', num_classes=3, in_channels=32, feat_channels=32, stacked_convs=1,
                       anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4, scales_per_octave=3,
                                             ratios=[0.5, 1.0, 2.0], strides=[8, 16, 32, 64, 128]),
                       bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[.0] * 4, target_stds=[1.0] * 4),
                       loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=1.0),
                       loss_bbox=dict(type='L1Loss', loss_weight=1.0))))
    det.init_weights()
    for k, v in det.backbone.state_dict().items():
        assert torch.equal(v, sd[k]), k
    feats = det.extract_feat(torch.randn(1, 3, 64, 96))
    assert len(feats) == 5


def test_pretrained_with_prefix_from_mmengine_checkpoint(tmp_path):
    """A whole detector checkpoint saved by mmengine (with its log objects in message_hub) by a run with the
    checkpoint opt-in loads safely where the opt-in is imported; elsewhere the error says what to import."""
    import numpy as np
    from mmengine.logging import HistoryBuffer

    import cpvt_backbones.adapters.checkpoint  # noqa: F401
    fw = 'mmseg'
    sd, _ = _classifier_weights(tmp_path)
    buffer = HistoryBuffer()
    buffer.update(np.float64(0.5))
    ckpt = {'meta': {'epoch': 1, 'seed': np.int64(3)}, 'message_hub': {'log_scalars': {'loss': buffer}},
            'state_dict': {**{f'backbone.{k}': v for k, v in sd.items() if not k.startswith(('head', 'norm.'))},
                           'decode_head.conv_seg.weight': torch.zeros(2, 8, 1, 1)}}
    path = tmp_path / 'segmentor.pth'
    torch.save(ckpt, path)
    refused = subprocess.run([sys.executable, '-c', 'import sys; from cpvt_backbones.convert import load_weights_file; '
                              'load_weights_file(sys.argv[1])', str(path)], capture_output=True, text=True)
    assert refused.returncode == 1 and 'cpvt_backbones.adapters.checkpoint is imported' in refused.stderr
    model = _build(fw, dict(type='PyramidCPVT', arch='pcpvt_tiny',
                              init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='backbone')))
    model.init_weights()
    assert torch.equal(model.state_dict()['blocks.3.1.mlp.fc2.weight'], sd['blocks.3.1.mlp.fc2.weight'])
    bad = _build(fw, dict(type='PyramidCPVT', arch='pcpvt_tiny',
                            init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='neck.')))
    with pytest.raises(ValueError, match="no key .* starts with prefix 'neck.'"):
        bad.init_weights()


def test_pretrained_mismatch_is_an_error_listing_keys(tmp_path):
    fw = 'mmdet'
    _, path = _classifier_weights(tmp_path)
    model = _build(fw, dict(type='PyramidCPVT', arch='pcpvt_small',
                              init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    with pytest.raises(CheckpointMismatchError, match='shape mismatches') as err:
        model.init_weights()
    assert str(path) in str(err.value) and 'missing keys' in str(err.value)


def test_mmpretrain_classifier_with_pooled_backbone(tmp_path):
    fw = 'mmpretrain'
    sd, path = _classifier_weights(tmp_path)
    clf = _build(fw, dict(
        type='ImageClassifier',
        backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny', out_type='pooled',
                      init_cfg=dict(type='Pretrained', checkpoint=str(path))),
        head=dict(type='LinearClsHead', num_classes=1000, in_channels=256, loss=dict(type='CrossEntropyLoss'))))
    clf.init_weights()
    clf.head.fc.load_state_dict({'weight': sd['head.weight'], 'bias': sd['head.bias']})
    ref = create_model('pcpvt_tiny').eval()
    ref.load_state_dict(sd)
    x = torch.randn(2, 3, 64, 80)
    clf.eval()
    with torch.no_grad():
        torch.testing.assert_close(clf(x, mode='tensor'), ref(x))


def test_tools_hide_only_the_known_third_party_warnings():
    """The messages mmengine/mmdet/mmseg print on every model they build are hidden; any other warning shows."""
    import warnings

    from cpvt_backbones.adapters.runner import quiet_known_warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        quiet_known_warnings()
        warnings.warn('Default ``avg_non_ignore`` is False, if you would like to ignore ...', UserWarning, stacklevel=1)
        warnings.warn('Failed to add <class \'mmengine.visualization.vis_backend.LocalVisBackend\'>, please ...',
                      stacklevel=1)
        warnings.warn('``build_loss`` would be deprecated soon, please use ``mmseg.registry.MODELS.build()``',
                      stacklevel=1)
        warnings.warn('The draw is False, it means that the hook for visualization will not take effect.',
                      stacklevel=1)
        warnings.warn('something of ours', stacklevel=1)
    assert [str(w.message) for w in seen] == ['something of ours']


def test_runner_logs_without_the_known_repeated_lines(tmp_path):
    """build_runner's logger drops mmengine's per-parameter paramwise lines and known notices, nothing else."""
    import logging
    from pathlib import Path

    from cpvt_backbones.adapters.runner import build_runner, load_config
    config = Path(__file__).resolve().parents[1] / 'configs/shapes/pcpvt-tiny_shapes-cls.py'
    cfg = load_config(str(config), work_dir=str(tmp_path))
    cfg.log_level = 'INFO'
    runner = build_runner(cfg)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    runner.logger.addHandler(handler)
    try:
        runner.logger.info('paramwise_options -- backbone.norm.weight:weight_decay=0.0')
        runner.logger.warning('The prefix is not set in metric class IoUMetric.')
        runner.logger.info('Iter(train) [ 50/1200]  lr: 1e-3')
    finally:
        runner.logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ['Iter(train) [ 50/1200]  lr: 1e-3']


def test_runners_of_one_process_write_under_their_own_work_dirs(tmp_path):
    """Two Runners of one config built in one process (the same second, the first one's folder gone): the second
    dumps its config and logs under its own work_dir, not under the first's."""
    import shutil
    from pathlib import Path

    from cpvt_backbones.adapters.runner import build_runner, load_config
    config = Path(__file__).resolve().parents[1] / 'configs/shapes/fpn_pcpvt-tiny_shapes.py'
    first = build_runner(load_config(str(config), work_dir=str(tmp_path / 'first')))
    shutil.rmtree(tmp_path / 'first')
    cfg = load_config(str(config), work_dir=str(tmp_path / 'second'))
    second = build_runner(cfg)
    assert cfg.visualizer.name == 'visualizer' and 'experiment_name' not in cfg    # the caller's config is unchanged
    assert second.experiment_name != first.experiment_name
    assert (Path(second.log_dir) / 'vis_data' / 'config.py').is_file()
    log_files = [h.baseFilename for h in second.logger.handlers if hasattr(h, 'baseFilename')]
    assert log_files and all(Path(f).is_relative_to(tmp_path / 'second') for f in log_files)


def _installed(engine: str):
    """``engine`` as a parameter, skipped by name where its packages are missing (the upstream and core stacks have
    no OpenVINO)."""
    from cpvt_backbones.deploy import ENGINES
    missing = ENGINES[engine].missing()
    return pytest.param(engine, marks=pytest.mark.skipif(bool(missing), reason=f'engine {engine!r} needs '
                                                                               f'{", ".join(missing)}'))


@pytest.mark.parametrize('engine', [_installed('openvino'), _installed('fused')])
def test_int8_keeps_the_configs_float32_modules_unless_told_otherwise(engine):
    """--keep-fp32: absent, the config's int8_keep_fp32; names, those; given without names, none. Every engine is
    asked for the same way, through the test loop's hook (the fused engine, the default, keeps the backbone's
    share of the names itself); other precisions refuse it by name, and an engine refuses a precision it does
    not run, naming those that do."""
    import argparse

    from mmengine.config import Config

    from cpvt_backbones.adapters.custom_hooks import use_engine
    from cpvt_backbones.adapters.engines import add_engine_args, kept_in_fp32
    cfg = Config(dict(int8_keep_fp32=['bbox_head.retina_cls'],
                      model=dict(backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny'))))
    assert kept_in_fp32(cfg) == ('bbox_head.retina_cls',) and kept_in_fp32(cfg, []) == ()
    assert kept_in_fp32(cfg, ['backbone.blocks.0']) == ('backbone.blocks.0',) and kept_in_fp32(Config()) == ()
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert '| fused | backbone | int8 |' in parser.epilog and '| onnxruntime | model | fp32 |' in parser.epilog
    for argv, hooked in (([], ('bbox_head.retina_cls',)), (['--keep-fp32'], ()),
                         (['--keep-fp32', 'neck', 'backbone.blocks.0'], ('neck', 'backbone.blocks.0'))):
        int8_cfg = copy.deepcopy(cfg)
        use_engine(int8_cfg, parser.parse_args(['--engine', engine, '--precision', 'int8', *argv]))
        assert int8_cfg.custom_hooks[-1]['request'].keep_fp32 == hooked
        assert int8_cfg.custom_hooks[-1]['request'].calibration_source == 'val'
    torch_cfg = copy.deepcopy(cfg)
    use_engine(torch_cfg, parser.parse_args(['--engine', 'torch', '--precision', 'bf16']))
    assert 'optimize' not in torch_cfg.model.backbone  # bf16: backbone, neck and head under autocast, by the hook
    (hook,) = torch_cfg.custom_hooks
    assert hook == dict(type='InferenceEngineHook', request=EngineRequest('torch', 'bf16'))
    assert 'cpvt_backbones.adapters.hooks' in torch_cfg.custom_imports['imports']
    fp32_cfg = copy.deepcopy(cfg)
    use_engine(fp32_cfg, parser.parse_args([]))
    assert fp32_cfg.custom_hooks[-1]['request'].engine == 'fused' and 'optimize' not in fp32_cfg.model.backbone
    with pytest.raises(SystemExit, match="calibration and keep_fp32 configure the calibrated precisions of engine "
                                         "'torch'"):
        use_engine(copy.deepcopy(cfg), parser.parse_args(['--engine', 'torch', '--precision', 'bf16', '--keep-fp32',
                                                          'neck']))
    with pytest.raises(SystemExit, match="calibration and keep_fp32 configure the calibrated precisions of engine "
                                         "'fused' \\(int8\\); precision='fp32'"):
        use_engine(copy.deepcopy(cfg), parser.parse_args(['--calibrate', 'val']))
    with pytest.raises(SystemExit, match="engine 'fused' runs fp32, int8, not 'bf16'; bf16 runs on: torch, openvino"):
        use_engine(copy.deepcopy(cfg), parser.parse_args(['--precision', 'bf16']))
    resnet = Config(dict(model=dict(backbone=dict(type='ResNet'))))
    with pytest.raises(SystemExit, match="engine 'fused' runs our backbones .*'ResNet'.*--engine torch"):
        use_engine(copy.deepcopy(resnet), parser.parse_args(['--engine', 'fused']))
    use_engine(resnet, parser.parse_args([]))  # the default for another backbone: the plain model
    assert resnet.custom_hooks[-1]['request'].engine == 'torch'


def test_one_engine_request_is_checked_once_and_reaches_the_engine_unchanged(monkeypatch, tmp_path):
    """The route from a config to an engine: the request a tool makes goes into the config's hook as it is (a
    config file's dict of fields is made into one there), is checked once, where it is made, and reaches the
    engine's transform not checked again, with the kept-float names renamed to the module it runs and its caches
    named in one place; a request with other arguments beside it is refused."""
    pytest.importorskip('mmengine')
    from mmengine.config import Config

    from cpvt_backbones.adapters.engines import config_request, engine_model
    from cpvt_backbones.adapters.hooks import InferenceEngineHook
    from cpvt_backbones.deploy import registry
    from cpvt_backbones.deploy.openmmlab import on_engine
    cfg = Config(dict(model=dict(backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny'))))
    checks, seen = [], []
    real_check = registry._engine
    monkeypatch.setattr(registry, '_engine', lambda *a: checks.append(a) or real_check(*a))
    asked = config_request(cfg, 'fused', 'int8', keep_fp32=['backbone.blocks.0', 'neck'], input_ranges='r.json',
                           cache=str(tmp_path / 'c'))
    hook = InferenceEngineHook(asked)
    assert hook.request is asked and checks == [('fused', 'int8')]
    from_file = InferenceEngineHook(dict(engine='fused', precision='int8', options=dict(input_ranges='r.json')))
    assert from_file.request == registry.EngineRequest('fused', 'int8', options=dict(input_ranges='r.json'))
    checks.clear()
    fake = registry.Engine('fused', 'backbone', {'int8': ''}, lambda module, *a: seen.append(a) or module, '',
                           calibrated=('int8',), options=('input_ranges',), calibration_option='input_ranges')
    monkeypatch.setitem(registry.ENGINES, 'fused', fake)
    model = type('Detector', (torch.nn.Module,), {})()
    model.backbone, model.neck = create_model('pcpvt_tiny'), torch.nn.Identity()
    engine_model(model, cfg, None, hook.request)
    assert checks == []  # not checked again on the way down
    (request, calibration, cache), = seen
    assert request.keep_fp32 == ('blocks.0',) and request.options == dict(input_ranges='r.json')
    assert calibration is None and cache.result('.ranges.json').path == tmp_path / 'c.ranges.json'
    with pytest.raises(ValueError, match='pass the request alone'):
        on_engine(model, hook.request, 'int8')
    with pytest.raises(ValueError, match=r"engine 'torch': \['keep_fp32'\] are fields of the request"):
        registry.EngineRequest('torch', options=dict(keep_fp32=['a']))
    with pytest.raises(ValueError, match='calibration_images must be at least 1'):
        registry.EngineRequest('fused', 'int8', calibration_source='val', calibration_images=0)


def test_svt_configs_get_the_engines_of_our_backbones():
    """Our backbones are the classes the OpenMMLab adapters register, Twins-SVT among them: an SVT config defaults
    to the fused engine and may ask for any engine; its settings are checked as PCPVT's are."""
    pytest.importorskip('mmengine')
    import argparse

    from mmengine.config import Config

    from cpvt_backbones.adapters.custom_hooks import use_engine
    from cpvt_backbones.adapters.engines import add_engine_args, default_engine
    from cpvt_backbones.adapters.runner import ConfigError, check_backbone_settings, our_backbone_types
    assert sorted(our_backbone_types()) == ['CPVT', 'PVTv2', 'PyramidCPVT', 'TwinsSVT']
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    for kind in ('TwinsSVT', 'mmseg.TwinsSVT'):
        cfg = Config(dict(model=dict(backbone=dict(type=kind, arch='svt_small'))))
        assert default_engine(cfg) == 'fused'
        use_engine(cfg, parser.parse_args(['--engine', 'fused', '--precision', 'int8']))
        assert cfg.custom_hooks[-1]['request'].engine == 'fused' and cfg.custom_hooks[-1]['request'].precision == 'int8'
    with pytest.raises(ConfigError, match=r"model\.backbone \(TwinsSVT\) has no setting\(s\) \['window_msk'\]"):
        check_backbone_settings(Config(dict(model=dict(backbone=dict(type='TwinsSVT', window_msk=True)))))
    resnet = Config(dict(model=dict(backbone=dict(type='ResNet'))))
    with pytest.raises(SystemExit, match=r"engine 'fused' runs our backbones \(PyramidCPVT, TwinsSVT, CPVT, PVTv2\)"):
        use_engine(resnet, parser.parse_args(['--engine', 'fused']))


def test_engine_caches_are_named_by_everything_that_changes_them(tmp_path, monkeypatch):
    """``cache_name``: the config's model section (after overrides), the checkpoint's content (not its path, size
    or time), the calibration (source, count, images' content), the kept-float layers and the versions each give
    another name; the same inputs the same name."""
    import os
    from pathlib import Path

    from PIL import Image

    from cpvt_backbones.adapters import engines
    from cpvt_backbones.adapters.runner import read_config
    shapes = Path(__file__).resolve().parents[1] / 'configs/shapes'
    det = read_config(str(shapes / 'retinanet_pcpvt-tiny_fpn_shapes.py'))
    seg = read_config(str(shapes / 'fpn_pcpvt-tiny_shapes.py'))
    ckpt = tmp_path / 'epoch_1.pth'
    ckpt.write_bytes(b'a' * 1000)
    folder = tmp_path / 'calib'
    folder.mkdir()
    Image.new('RGB', (9, 7), (10, 20, 30)).save(folder / 'x.png')
    name = engines.cache_name(det, ckpt, 'float')
    assert engines.cache_name(det, ckpt, 'float') == name and name.startswith('epoch_1-float-')
    thresholds = copy.deepcopy(det)   # post-processing: no engine runs it, so the same conversion serves
    thresholds.model.test_cfg.score_thr = 0.0
    assert engines.cache_name(thresholds, ckpt, 'float') == name
    bilinear = copy.deepcopy(det)
    bilinear.model.neck.upsample_cfg = dict(mode='bilinear')
    others = [engines.cache_name(bilinear, ckpt, 'float'), engines.cache_name(seg, ckpt, 'float'),
              engines.cache_name(det, ckpt, 'int8', ('val', 32)), engines.cache_name(det, ckpt, 'int8', ('val', 8)),
              engines.cache_name(det, ckpt, 'int8', ('val', 32), 'neck'),
              engines.cache_name(det, ckpt, 'int8', (str(folder), 32))]
    stat = ckpt.stat()
    ckpt.write_bytes(b'b' * 1000)  # same path, size and time, other weights
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    others.append(engines.cache_name(det, ckpt, 'float'))
    Image.new('RGB', (9, 7), (10, 20, 31)).save(folder / 'x.png')
    others.append(engines.cache_name(det, ckpt, 'int8', (str(folder), 32)))
    monkeypatch.setattr(engines, 'package_versions', lambda *names: {'openvino': 'another'})
    others.append(engines.cache_name(det, ckpt, 'float'))
    assert len({name, *others}) == len(others) + 1


def test_every_engine_cache_misses_when_a_package_it_requires_is_upgraded(tmp_path, monkeypatch):
    """Each engine's cache names are keyed by this package's, torch's and its own required packages' versions
    (the registry's ``requires``): reporting another version of any of them renames every cache of that engine;
    another engine's package leaves it alone."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    from cpvt_backbones.adapters import engines
    from cpvt_backbones.adapters.runner import read_config
    from cpvt_backbones.deploy import ENGINES
    det = read_config(str(Path(__file__).resolve().parents[1] / 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py'))
    ckpt = tmp_path / 'epoch_1.pth'
    ckpt.write_bytes(b'a' * 1000)
    installed = importlib.metadata.version
    from cpvt_backbones.deploy.artifacts import package_versions
    assert set(package_versions(ENGINES['onnxruntime'].requires)) >= {'cpvt_backbones', 'torch', 'onnxruntime',
                                                                       'onnxscript'}
    for name, spec in ENGINES.items():
        before = engines.cache_name(det, ckpt, 'float', engine=name)
        # an engine whose package this stack lacks makes no cache (STACK=upstream has no OpenVINO)
        for package in ('cpvt_backbones', 'torch', *(p for p in spec.requires if importlib.util.find_spec(p))):
            monkeypatch.setattr(importlib.metadata, 'version',
                                lambda p, package=package: 'upgraded' if p == package else installed(p))
            assert engines.cache_name(det, ckpt, 'float', engine=name) != before, (name, package)
        others = {p for e in ENGINES.values() for p in e.requires} - set(spec.requires)
        for package in others:
            monkeypatch.setattr(importlib.metadata, 'version',
                                lambda p, package=package: 'upgraded' if p == package else installed(p))
            assert engines.cache_name(det, ckpt, 'float', engine=name) == before, (name, package)
        monkeypatch.setattr(importlib.metadata, 'version', installed)


def test_calibration_skips_an_unreadable_image_by_name(tmp_path):
    from pathlib import Path

    from mmengine.registry import init_default_scope
    from PIL import Image

    from cpvt_backbones.adapters import engines
    from cpvt_backbones.adapters.runner import read_config
    cfg = read_config(str(Path(__file__).resolve().parents[1] / 'configs/shapes/fpn_pcpvt-tiny_shapes.py'))
    init_default_scope(cfg.default_scope)
    for i in range(3):
        Image.new('RGB', (40, 30), (i, 2 * i, 3 * i)).save(tmp_path / f'{i}.png')
    (tmp_path / '1.png').write_bytes(b'')  # zero bytes
    (tmp_path / '3.jpg').write_bytes(b'not an image')
    source, images = engines._calibration_source(str(tmp_path))
    with pytest.warns(RuntimeWarning) as caught:
        batches = list(engines.calibration_batches(cfg, images, 2))
    assert len(batches) == 2 and [b['data_samples'][0].img_path for b, _ in batches] == \
        [str(tmp_path / '0.png'), str(tmp_path / '2.png')]
    assert any(f'calibration: {tmp_path / "1.png"} skipped (' in str(w.message) for w in caught)
    for p in tmp_path.glob('*.png'):
        p.write_bytes(b'')
    with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match='none of the 4 image'):
        list(engines.calibration_batches(cfg, images, 2))
