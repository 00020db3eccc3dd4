"""The one artifact cache of the engines (``deploy.artifacts``): what it reuses, what it refuses and why, and that
no crash leaves what it would take as whole."""
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.deploy.artifacts import SAVING, Artifact, ArtifactCache, artifact_path, model_fingerprint
from cpvt_backbones.deploy.registry import ENGINES, Calibration, Engine, EngineRequest, prepare


def write_pair(path):
    path.write_bytes(b'graph' * 100)
    path.with_suffix('.bin').write_bytes(bytes(range(256)) * 8)


def artifact(tmp_path, source='model-a', versions=None, name='m.xml'):
    return Artifact(tmp_path / name, 'test', source, versions or {'torch': '1'}, ('.bin',))


def test_a_saved_artifact_is_reused_only_where_its_record_holds(tmp_path):
    """Saved, it is read back; each way it can go wrong is named (and load warns, returning None): a damaged or
    truncated or missing file, no record, another model's fingerprint, other package versions."""
    calibration = Calibration([torch.ones(4, 3, 2, 2)], 'val')
    saved = Artifact(tmp_path / 'm.xml', 'test', 'model-a', {'torch': '1'}, ('.bin',),
                     calibration=calibration.describe())
    assert saved.load() is None   # nothing there: no warning
    assert saved.save(write_pair) == tmp_path / 'm.xml'
    record = json.loads((tmp_path / 'm.xml.record.json').read_text())
    assert record['source'] == 'model-a' and record['versions'] == {'torch': '1'} and set(record['files']) == {
        'file', '.bin'}
    assert {k: record['calibration'][k] for k in ('source', 'batches', 'images')} == dict(source='val', batches=1,
                                                                                         images=4)
    assert saved.load() == tmp_path / 'm.xml'
    assert 'made from another model' in artifact(tmp_path, source='model-b').problem()
    assert 'made by other package versions' in artifact(tmp_path, versions={'torch': '2'}).problem()
    weights = tmp_path / 'm.bin'
    good = weights.read_bytes()
    damage = {'does not have the sha256': lambda: weights.write_bytes(good[:100] + bytes([good[100] ^ 0xFF])
                                                                     + good[101:]),
              'truncated': lambda: weights.write_bytes(good[:len(good) // 2]),
              f'{weights} is missing': weights.unlink,
              'not saved by cpvt_backbones': lambda: (tmp_path / 'm.xml.record.json').unlink()}
    for says, harm in damage.items():
        harm()
        with pytest.warns(RuntimeWarning, match=f'test cache {tmp_path / "m.xml"}: .*{says}.*making it again'):
            assert saved.load() is None
        saved.save(write_pair)
        assert saved.load() is not None and weights.read_bytes() == good


def test_an_unwritable_cache_is_skipped_with_a_warning(tmp_path):
    blocker = tmp_path / 'not_a_folder'
    blocker.write_text('')
    with pytest.warns(RuntimeWarning, match='test cache .*not_a_folder/m.xml not written .*running without it'):
        assert artifact(blocker).save(write_pair) is None


def test_a_killed_save_leaves_nothing_the_next_save_does_not_remove(tmp_path):
    """A save killed between writing and renaming leaves its temporary folder and nothing under the final name;
    the next save in that folder removes it."""
    script = f'''
import time
from pathlib import Path
from cpvt_backbones.deploy import artifacts
artifacts.file_sha256 = lambda path: time.sleep(600)  # stop between writing and renaming
def write(path):
    path.write_bytes(b'x')
    path.with_suffix('.bin').write_bytes(b'y')
artifacts.Artifact(Path({str(tmp_path / 'm.xml')!r}), 'test', 's', {{}}, ('.bin',)).save(write)
'''
    proc = subprocess.Popen([sys.executable, '-c', script])
    deadline = time.time() + 120
    while not list(tmp_path.glob(f'{SAVING}*/m.bin')) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(tmp_path.glob(f'{SAVING}*')) and not (tmp_path / 'm.xml').exists()
    artifact(tmp_path, name='n.xml').save(write_pair)
    assert sorted(f.name for f in tmp_path.iterdir()) == ['n.bin', 'n.xml', 'n.xml.record.json']


def test_a_requests_artifacts_are_named_in_one_place(tmp_path, monkeypatch):
    """At a precision the engine calibrates the result and the float32 conversion are two artifacts (its cache and
    float_cache); elsewhere one, named by either prefix; a variant is kept apart; no prefix, no artifact."""
    converting = Engine('converting', 'model', {'fp32': '', 'int8': ''}, lambda module, *a: module, '',
                        calibrated=('int8',))
    monkeypatch.setitem(ENGINES, converting.name, converting)
    model = torch.nn.Linear(2, 2)

    def cache(precision='fp32', **prefixes):
        return ArtifactCache(EngineRequest('converting', precision, **prefixes), model)
    int8 = cache('int8', cache=f'{tmp_path}/q', float_cache=f'{tmp_path}/f')
    assert int8.result('.xml').path == tmp_path / 'q.xml' and int8.conversion('.xml').path == tmp_path / 'f.xml'
    fp32 = cache(cache=f'{tmp_path}/q')
    assert fp32.result('.xml').path == fp32.conversion('.xml').path == tmp_path / 'q.xml'
    assert fp32.conversion('.xml', 'valid_sizes').path == tmp_path / 'q.valid_sizes.xml'
    assert artifact_path('a/b', '.onnx') == type(tmp_path)('a/b.onnx')
    none = cache('int8')
    assert none.result('.xml') is None and none.conversion('.xml') is None
    assert cache('int8', cache='q').conversion('.xml') is None


def test_the_fingerprint_tells_models_apart():
    """Structure, settings and weights each change the fingerprint; a copy has the same one."""
    import copy
    torch.manual_seed(0)
    first = create_model('pcpvt_tiny', features_only=True, out_indices=(3,))
    torch.manual_seed(1)
    other = create_model('pcpvt_tiny', features_only=True, out_indices=(3,))
    fewer = create_model('pcpvt_tiny', features_only=True, out_indices=(2, 3))
    fewer.load_state_dict(first.state_dict())
    prints = [model_fingerprint(m) for m in (first, other, fewer, copy.deepcopy(first))]
    assert len(set(prints[:3])) == 3 and prints[3] == prints[0]


def test_an_artifact_made_for_another_request_is_refused_naming_what_differs(tmp_path):
    """What an artifact was made for (precision, keep_fp32, calibration, options) is recorded and compared: any
    difference is named, with what was recorded and what is asked."""
    made = dict(precision='int8', keep_fp32=['blocks.0'], calibration='a' * 64, options={'example_size': (224, 224)})
    saved = Artifact(tmp_path / 'm.xml', 'test', 's', {}, ('.bin',), made)
    saved.save(write_pair)
    assert saved.load() == tmp_path / 'm.xml'
    for change, says in ((dict(precision='fp32'), "precision 'int8' (asked: 'fp32')"),
                         (dict(keep_fp32=[]), "keep_fp32 ['blocks.0'] (asked: [])"),
                         (dict(calibration='b' * 64), 'calibration '),
                         (dict(options={}), "options {'example_size': [224, 224]} (asked: {})")):
        other = Artifact(tmp_path / 'm.xml', 'test', 's', {}, ('.bin',), {**made, **change})
        assert other.problem() == f'it was made for another request: {says}' or says in other.problem()
        with pytest.warns(RuntimeWarning, match='made for another request'):
            assert other.load() is None


CALIBRATED = [name for name, spec in ENGINES.items() if spec.calibrated]


def calibration_batches(seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    return [scale * torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(seed + i)) for i in range(2)]


@pytest.mark.parametrize('engine', [pytest.param(e, marks=pytest.mark.heavy) if ENGINES[e].requires else e
                                    for e in CALIBRATED])   # an engine with packages converts: 1-2 min
def test_one_cache_prefix_serves_each_request_what_it_asked_for(engine, tmp_path):
    """Requests of one model over one ``cache`` prefix, one after another: float32 over a saved int8 model, int8
    over what float32 left there, int8 on other calibration batches, int8 with other ``keep_fp32``. Each runs what
    it asked for (what a prepare without a cache gives); where the prefix held another request's artifact it is
    made again with a warning naming what differs (an engine that saves nothing at float32 finds its int8 artifact
    still there); the same request again reads its artifact back without a word."""
    import warnings

    from test_engines import relative, runnable, small
    runnable(engine, 'int8')
    model, prefix = small(), str(tmp_path / 'p')
    x = torch.randn(1, 3, 97, 131, generator=torch.Generator().manual_seed(7))
    narrow, wide = calibration_batches(0, 0.05), calibration_batches(10)

    def run(precision, differs=None, must=False, cache=prefix, **request):
        """The prepared model's output on ``x``; the cache warnings must each name ``differs`` (None: none
        allowed), and with ``must`` there must be one."""
        if precision in ENGINES[engine].calibrated:   # one float32 conversion for every int8 model
            request['float_cache'] = str(tmp_path / 'float')
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter('always')
            prepared = prepare(model, engine, precision, **(dict(cache=cache) if cache else {}), **request)
        said = [str(w.message) for w in seen if 'cache' in str(w.message)]
        assert all(differs and 'made for another request' in s and differs in s for s in said), said
        assert said or not must
        with torch.no_grad():
            return prepared(x)

    with torch.no_grad():
        plain = model(x)
    first = run('int8', calibration=narrow)
    assert relative(run('fp32', differs="precision 'int8' (asked: 'fp32')"), plain) < 1e-5
    assert relative(run('int8', differs="precision 'fp32' (asked: 'int8')", calibration=narrow), first) < 1e-6
    others = run('int8', differs='calibration', must=True, calibration=wide)
    assert relative(others, run('int8', cache=None, calibration=wide)) < 1e-6 and relative(others, first) > 1e-5
    kept = run('int8', differs='keep_fp32', must=True, calibration=wide, keep_fp32=['blocks.0'])
    assert relative(kept, others) > 1e-5
    assert relative(run('int8', calibration=wide, keep_fp32='blocks.0'), kept) < 1e-6
    recorded = json.loads(next(tmp_path.glob('p.*.record.json')).read_text())['made_for']
    assert recorded['keep_fp32'] == ['blocks.0'] and recorded['precision'] == 'int8'


@pytest.mark.parametrize('engine', CALIBRATED)
def test_every_engine_refuses_calibration_that_does_not_fit_naming_the_batch(engine):
    """One check of calibration batches for every engine, before anything is converted: raw uint8 pixels, a NaN,
    a 3-D image, another number of channels, one tensor instead of batches, nothing at all."""
    from test_engines import runnable, small
    runnable(engine, 'int8')
    good = torch.randn(2, 3, 64, 64)
    nan = good.clone()
    nan[1, 2, 3, 4] = float('nan')
    bad = {r'batch 1: expected a floating-point tensor.*uint8': [good, (good.abs() * 80).to(torch.uint8)],
           r'batch 0: input of shape \(2, 3, 64, 64\) contains 1 NaN or Inf': [nan],
           r'batch 0: expected a 4-D NCHW tensor': [good[0]],
           r'batch 1: expected 3 input channels': [good, torch.randn(2, 4, 64, 64)],
           r'got one tensor of shape \(2, 3, 64, 64\): pass \[batch\]': good,
           'calibration is empty': []}
    for says, calibration in bad.items():
        with pytest.raises((TypeError, ValueError), match=says):
            prepare(small(), engine, 'int8', calibration=calibration)


@pytest.mark.parametrize('engine', CALIBRATED)
def test_keep_fp32_is_checked_the_same_way_on_every_engine(engine, tmp_path):
    """A name that is no module of the model is refused by name before anything is converted, a plain string is
    one name, and the int8 model and its float32 conversion cannot share one prefix."""
    from test_engines import runnable, small
    runnable(engine, 'int8')
    calibration = calibration_batches(0)
    with pytest.raises(ValueError, match=r"keep_fp32: 'blocks.9' is not a module of PyramidCPVT.*such as "
                                         r"'patch_embeds'"):
        prepare(small(), engine, 'int8', calibration=calibration, keep_fp32=['blocks.0', 'blocks.9'])
    assert EngineRequest(engine, 'int8', keep_fp32='blocks').keep_fp32 == ('blocks',)
    with pytest.raises(ValueError, match='keep_fp32 takes module names'):
        EngineRequest(engine, 'int8', keep_fp32=[0])
    with pytest.raises(ValueError, match='cache and float_cache both name'):
        EngineRequest(engine, 'int8', cache=str(tmp_path / 'p'), float_cache=str(tmp_path / 'p'))


def test_keep_fp32_keeps_a_module_and_what_is_under_it_only():
    """'blocks.1' keeps the linear layers of blocks.1 in float32, not those of blocks.10 and 11; 'blocks' keeps
    every block's."""
    from test_engines import runnable
    runnable('fused', 'int8')
    torch.manual_seed(0)
    model = create_model('cpvt_tiny', num_classes=0).eval()
    calibration = [torch.randn(1, 3, 32, 32)]

    def float32_layers(keep):
        prepared = prepare(model, 'fused', 'int8', calibration=calibration, keep_fp32=keep)
        return sorted(n for n, m in prepared.named_modules() if getattr(m, 'kernel', 'onednn_int8') != 'onednn_int8')
    assert float32_layers(['blocks.1']) == [f'blocks.1.{n}' for n in ('attn.kv', 'attn.proj', 'attn.q', 'mlp.fc1',
                                                                          'mlp.fc2')]
    assert len(float32_layers('blocks')) == 5 * len(model.blocks)
