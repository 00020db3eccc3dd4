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
from cpvt_backbones.deploy.registry import ENGINES, Calibration, Engine, EngineRequest


def write_pair(path):
    path.write_bytes(b'graph' * 100)
    path.with_suffix('.bin').write_bytes(bytes(range(256)) * 8)


def artifact(tmp_path, source='model-a', versions=None, name='m.xml'):
    return Artifact(tmp_path / name, 'test', source, versions or {'torch': '1'}, ('.bin',))


def test_a_saved_artifact_is_reused_only_where_its_record_holds(tmp_path):
    """Saved, it is read back; each way it can go wrong is named (and load warns, returning None): a damaged or
    truncated or missing file, no record, another model's fingerprint, other package versions."""
    saved = artifact(tmp_path)
    assert saved.load() is None   # nothing there: no warning
    calibration = Calibration([torch.ones(4, 3, 2, 2)], 'val')
    assert saved.save(lambda path: [*calibration] and write_pair(path), calibration) == tmp_path / 'm.xml'
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
