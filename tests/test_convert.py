"""Weight files and layout converters: strict, safe, and clear about what does not fit."""
import pickle

import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.convert import (CheckpointMismatchError, UnknownKeysError, detect_layout, load_into,
                                    load_pretrained, load_weights_file, mmseg_to_twins, twins_to_mmseg,
                                    unwrap_state_dict)


@pytest.fixture(scope='module')
def small_sd():
    torch.manual_seed(0)
    return create_model('pcpvt_small').state_dict()


def test_mmseg_round_trip(small_sd):
    mm = twins_to_mmseg(small_sd)
    assert detect_layout(mm) == 'mmseg'
    assert 'layers.0.0.attn.attn.in_proj_weight' in mm and mm['layers.0.0.attn.attn.in_proj_weight'].shape == (192, 64)
    assert not any(k.startswith(('head.', 'norm.')) for k in mm)
    back = mmseg_to_twins(mm)
    expected = {k: v for k, v in small_sd.items() if not k.startswith(('head.', 'norm.'))}
    assert set(back) == set(expected)
    for k in expected:
        assert torch.equal(back[k], expected[k]), k


def test_converters_raise_on_unknown_keys(small_sd):
    mm = twins_to_mmseg(small_sd)
    with pytest.raises(UnknownKeysError, match='layers.0.0.extra.weight'):
        mmseg_to_twins({**mm, 'layers.0.0.extra.weight': torch.zeros(1)})
    with pytest.raises(UnknownKeysError, match='blocks.0.0.attn.qkv.weight'):
        twins_to_mmseg({**small_sd, 'blocks.0.0.attn.qkv.weight': torch.zeros(1)})
    lone_q = {k: v for k, v in small_sd.items() if k != 'blocks.1.0.attn.kv.weight'}
    with pytest.raises(UnknownKeysError, match='blocks.1.0.attn.q.weight'):
        twins_to_mmseg(lone_q)
    with pytest.raises(ValueError, match='unrecognised checkpoint layout'):
        detect_layout({'features.0.weight': torch.zeros(1)})


def test_mmseg_layout_loads_into_dense_backbone(small_sd):
    dense = create_model('pcpvt_small', features_only=True)
    load_into(dense, twins_to_mmseg(small_sd))
    for k, v in dense.state_dict().items():
        assert torch.equal(v, small_sd[k])


def test_mismatch_lists_missing_unexpected_and_shapes(small_sd):
    model = create_model('pcpvt_tiny')
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as err:
        load_into(model, small_sd)
    msg = str(err.value)
    assert 'nothing was loaded' in msg and 'shape mismatches' in msg and 'unexpected keys' in msg
    assert ('patch_embeds.0.proj.weight', (64, 3, 4, 4), (32, 3, 4, 4)) in err.value.report.mismatched
    assert 'unexpected keys (140)' in msg and '(143 more)' in msg  # counted, the first 20 of each named
    single = {k: v for k, v in model.state_dict().items()}
    single['head.weight'] = torch.zeros(3, 256)
    with pytest.raises(CheckpointMismatchError, match=r'head.weight checkpoint \(3, 256\) vs model \(1000, 256\)'):
        load_into(model, single)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing loaded
    partial = dict(small_sd)
    partial.pop('blocks.0.0.norm1.weight')
    with pytest.raises(CheckpointMismatchError, match=r'missing keys \(1\): blocks.0.0.norm1.weight'):
        load_into(create_model('pcpvt_small'), partial)


def test_non_strict_loads_what_fits(small_sd):
    model = create_model('pcpvt_base')
    report = load_into(model, small_sd, strict=False)
    assert report.missing and not report.unexpected and not report.mismatched
    assert torch.equal(model.state_dict()['blocks.2.5.mlp.fc1.weight'], small_sd['blocks.2.5.mlp.fc1.weight'])


@pytest.mark.parametrize('wrap', ['plain', 'model', 'state_dict', 'ddp'])
def test_wrapped_files(tmp_path, small_sd, wrap):
    obj = {'plain': small_sd, 'model': {'model': small_sd, 'epoch': 3},
           'state_dict': {'state_dict': small_sd, 'meta': {'epoch': 3}},
           'ddp': {f'module.{k}': v for k, v in small_sd.items()}}[wrap]
    path = tmp_path / 'w.pth'
    torch.save(obj, path)
    model = create_model('pcpvt_small', pretrained=str(path))
    for k, v in model.state_dict().items():
        assert torch.equal(v, small_sd[k])


def test_safetensors(tmp_path, small_sd):
    safetensors = pytest.importorskip('safetensors.torch')
    path = tmp_path / 'w.safetensors'
    safetensors.save_file({k: v.contiguous() for k, v in small_sd.items()}, str(path))
    dense = create_model('pcpvt_small', features_only=True, pretrained=str(path))
    assert torch.equal(dense.state_dict()['pos_block.3.proj.0.bias'], small_sd['pos_block.3.proj.0.bias'])


class _Exploit:
    def __reduce__(self):
        return (print, ('this must never run',))


def test_code_running_pickle_is_refused(tmp_path, capsys):
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'x': torch.zeros(1)}, 'payload': _Exploit()}, path)
    with pytest.raises(ValueError, match='weights_only=True'):
        load_weights_file(path)
    assert 'this must never run' not in capsys.readouterr().out


@pytest.mark.parametrize('damage', ['truncate', 'garbage'])
def test_corrupt_file_is_a_clear_error(tmp_path, small_sd, damage):
    path = tmp_path / 'w.pth'
    torch.save(small_sd, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == 'truncate' else b'not a checkpoint' * 10)
    with pytest.raises(ValueError, match='truncated or corrupt'):
        load_weights_file(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match='weight file not found'):
        load_pretrained(create_model('pcpvt_tiny'), '/nonexistent/w.pth')


def test_unwrap_rejects_non_state_dicts():
    with pytest.raises(ValueError, match='holds no state dict'):
        unwrap_state_dict({'epoch': 3, 'args': 'x'})
    with pytest.raises(ValueError, match='holds no state dict'):
        unwrap_state_dict(pickle.dumps(1))
