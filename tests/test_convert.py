"""Weight files and layout converters: strict, safe, and clear about what does not fit."""
import os
import pickle

import pytest
import torch
from tool_server import run_tool
from torch import nn

from cpvt_backbones import create_model
from cpvt_backbones.convert import (
    CheckpointMismatchError,
    UnknownKeysError,
    backbone_only,
    classifier_to_native,
    deit_to_native,
    detect_layout,
    from_native,
    load_into,
    load_pretrained,
    load_weights_file,
    mmpretrain_to_native,
    mmseg_to_native,
    native_to_mmpretrain,
    native_to_mmseg,
    to_native,
    unwrap_state_dict,
)
from cpvt_backbones.layers.position import (
    ENCODINGS,
    PositionEncoding,
    register_encoding,
    registered_encoding,
    state_dict_roots,
)


@pytest.fixture(scope='module')
def small_sd():
    torch.manual_seed(0)
    return create_model('pcpvt_small').state_dict()


def test_mmseg_round_trip(small_sd):
    mm = native_to_mmseg(small_sd)
    assert detect_layout(mm) == 'mmseg'
    assert 'layers.0.0.attn.attn.in_proj_weight' in mm and mm['layers.0.0.attn.attn.in_proj_weight'].shape == (192, 64)
    assert not any(k.startswith(('head.', 'norm.')) for k in mm)
    back = mmseg_to_native(mm)
    expected = {k: v for k, v in small_sd.items() if not k.startswith(('head.', 'norm.'))}
    assert set(back) == set(expected)
    for k in expected:
        assert torch.equal(back[k], expected[k]), k


def test_converters_raise_on_unknown_keys(small_sd):
    mm = native_to_mmseg(small_sd)
    with pytest.raises(UnknownKeysError, match='layers.0.0.extra.weight'):
        mmseg_to_native({**mm, 'layers.0.0.extra.weight': torch.zeros(1)})
    with pytest.raises(UnknownKeysError, match='blocks.0.0.attn.qkv.weight'):
        native_to_mmseg({**small_sd, 'blocks.0.0.attn.qkv.weight': torch.zeros(1)})
    lone_q = {k: v for k, v in small_sd.items() if k != 'blocks.1.0.attn.kv.weight'}
    with pytest.raises(UnknownKeysError, match='blocks.1.0.attn.q.weight'):
        native_to_mmseg(lone_q)
    with pytest.raises(ValueError, match='unrecognised checkpoint layout'):
        detect_layout({'features.0.weight': torch.zeros(1)})


def test_mmseg_layout_loads_into_dense_backbone(small_sd):
    dense = create_model('pcpvt_small', features_only=True)
    load_into(dense, native_to_mmseg(small_sd))
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


def test_a_checkpoint_of_another_family_is_named_first_with_what_to_load_it_into(tmp_path):
    """An SVT checkpoint for a PCPVT model (and the other way round, and a CPVT one), in our layout or mmseg's,
    through ``load_into``, ``pretrained=`` and mmengine's whole-model check: the message starts with the file's
    family and the named model it fits, then a few keys of each kind (the counts kept), not 2.5 KB of keys."""
    svt, pcpvt = create_model('svt_small').state_dict(), create_model('pcpvt_small').state_dict()
    with pytest.raises(CheckpointMismatchError) as err:
        load_into(create_model('pcpvt_small'), svt)
    msg = str(err.value)
    assert msg.startswith("checkpoint does not fit the model: it is a Twins-SVT checkpoint (embed_dims (64, 128, "
                          "256, 512), depths (2, 2, 10, 4)) and the model is a Twins-PCPVT: load it into "
                          "'svt_small' (TwinsSVT). Nothing was loaded; what does not fit: missing keys (102): "), msg
    assert 'unexpected keys (88): blocks.0.0.attn.qkv.bias' in msg and '(85 more)' in msg and len(msg) < 800
    path = tmp_path / 'pcpvt_small_mmseg.pth'
    torch.save(dict(state_dict=native_to_mmseg(pcpvt)), path)
    with pytest.raises(CheckpointMismatchError, match=rf"^{path} does not fit the model: it is a Twins-PCPVT "
                                                      r".* load it into 'pcpvt_small' \(PyramidCPVT\)\."):
        create_model('svt_small', features_only=True, pretrained=str(path))
    with pytest.raises(CheckpointMismatchError, match=r"it is a CPVT checkpoint \(embed_dim 192, depth 2, "
                                                      r"class_token False\) and the model is a Twins-SVT: load "
                                                      r"it into a CPVT built with those settings"):
        load_into(create_model('svt_small'),
                  create_model('cpvt_tiny_gap', depth=2, pos_encoding=dict(type='peg', positions=(0,))).state_dict())
    same_family = str(pytest.raises(CheckpointMismatchError, load_into, create_model('pcpvt_tiny'), pcpvt).value)
    assert 'it is a' not in same_family and '(143 more)' in same_family  # another size: every kind, 20 keys each
    pytest.importorskip('mmengine')
    from cpvt_backbones.adapters.runner import refuse_unfit
    detector = {f'backbone.{k}': v for k, v in svt.items()}
    with pytest.raises(CheckpointMismatchError, match=r"^checkpoint c.pth does not fit the model: it is a "
                                                      r"Twins-SVT checkpoint .* load it into 'svt_small'"):
        refuse_unfit(nn.ModuleDict(dict(backbone=create_model('pcpvt_small'))), {'state_dict': detector},
                     'checkpoint c.pth')


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


@pytest.mark.parametrize('dtype', [torch.int64, torch.bool, torch.float8_e4m3fn])
def test_values_of_another_kind_are_refused_by_key(tmp_path, small_sd, dtype):
    """Integers, booleans or 8-bit floats where the model has a float tensor would be cast into other numbers:
    refused, naming the keys; 16-bit floats load (as torch's own cast would)."""
    safetensors = pytest.importorskip('safetensors.torch')
    path = tmp_path / 'w.safetensors'
    bad = ['blocks.0.0.attn.q.weight', 'norm.bias']
    sd = {k: (v.to(dtype) if k in bad else v).contiguous() for k, v in small_sd.items()}
    safetensors.save_file(sd, str(path))
    with pytest.raises(CheckpointMismatchError, match=r'values the model cannot take \(2\): '
                       rf'blocks.0.0.attn.q.weight is {dtype} in the checkpoint, torch.float32 in the model'):
        create_model('pcpvt_small', pretrained=str(path))
    report = load_into(create_model('pcpvt_small'), load_weights_file(path), strict=False)
    assert [k for k, _, _ in report.wrong_dtype] == bad and not report.missing
    half = {k: v.half() for k, v in small_sd.items()}
    safetensors.save_file(half, str(path))
    assert torch.equal(create_model('pcpvt_small', pretrained=str(path)).state_dict()['norm.bias'],
                       half['norm.bias'].float())


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


@pytest.fixture(params=['torch weights_only', 'restricted unpickler'])
def safe_loader(request, monkeypatch):
    """Both ways ``safe_load`` works: torch's weights-only loader (torch >= 2.5) and the restricted unpickler that
    older torch uses, forced here on any torch."""
    from cpvt_backbones.convert import io
    if request.param == 'restricted unpickler':
        monkeypatch.setattr(io, 'supports', lambda feature: False)
    elif not io.supports('safe_globals'):
        pytest.skip(f'torch {torch.__version__} has no torch.serialization.safe_globals (torch >= 2.5)')
    return request.param


def test_code_running_pickle_is_refused(tmp_path, safe_loader, small_sd):
    from cpvt_backbones.convert import safe_load
    path, marker = tmp_path / 'evil.pth', tmp_path / 'ran'
    torch.save({'state_dict': {'x': torch.zeros(1)}, 'payload': _Exploit(marker)}, path)
    with pytest.raises(ValueError, match='weights_only=True.*posix.system'):
        load_weights_file(path)
    with pytest.raises(pickle.UnpicklingError, match='posix.system'):
        safe_load(path)
    assert not marker.exists()
    torch.save({'model': small_sd, 'meta': {'epoch': 3, 'note': b'bytes', 'dtype': torch.float16}}, path)
    loaded = safe_load(path)
    assert loaded['meta'] == {'epoch': 3, 'note': b'bytes', 'dtype': torch.float16}
    assert all(torch.equal(small_sd[k], v) for k, v in load_weights_file(path).items())


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


def test_mmpretrain_round_trip_and_layout_detection(small_sd):
    mm = native_to_mmpretrain(small_sd)
    assert detect_layout(mm) == 'mmpretrain'
    assert mm['backbone.stages.2.5.ffn.layers.0.0.weight'].shape == (1280, 320)
    assert 'backbone.norm_after_stage3.bias' in mm and 'head.fc.weight' in mm
    for source in (mm, {k[len('backbone.'):]: v for k, v in mm.items() if k.startswith('backbone.')}):
        back = mmpretrain_to_native(source)
        expected = small_sd if 'head.fc.weight' in source else {k: v for k, v in small_sd.items()
                                                                if not k.startswith('head.')}
        assert set(back) == set(expected) and all(torch.equal(back[k], expected[k]) for k in expected)
    with pytest.raises(UnknownKeysError, match='backbone.norm_after_stage1.weight'):
        mmpretrain_to_native({**mm, 'backbone.norm_after_stage1.weight': torch.zeros(1)})


def test_our_classifier_layout_and_backbone_only(small_sd):
    wrapped = {**{f'backbone.{k}': v for k, v in small_sd.items() if not k.startswith('head.')},
               'head.fc.weight': small_sd['head.weight'], 'head.fc.bias': small_sd['head.bias']}
    assert detect_layout(wrapped) == 'classifier'
    assert set(classifier_to_native(wrapped)) == set(small_sd)
    with pytest.raises(UnknownKeysError, match='backbone.head.weight'):
        classifier_to_native({**wrapped, 'backbone.head.weight': torch.zeros(1)})
    dense = backbone_only(wrapped)
    assert set(dense) == {k for k in small_sd if not k.startswith('head.')}
    assert set(from_native(small_sd, 'backbone')) == set(dense)
    with pytest.raises(ValueError, match="cannot write layout 'timm'"):
        from_native(small_sd, 'timm')


@pytest.mark.heavy
def test_mmpretrain_pcpvt_gives_our_logits(small_sd):
    """mmpretrain's own PCPVT classifier with our weights, converted by our function: same logits."""
    pytest.importorskip('mmpretrain')
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        theirs = MODELS.build(dict(
            type='ImageClassifier', neck=dict(type='GlobalAveragePooling'),
            backbone=dict(type='PCPVT', arch='small', qkv_bias=True, norm_cfg=dict(type='LN', eps=1e-6),
                          norm_after_stage=[False, False, False, True]),
            head=dict(type='LinearClsHead', num_classes=1000, in_channels=512)))
    theirs.load_state_dict(native_to_mmpretrain(small_sd), strict=True)
    # As mmpretrain's Twins configs: LN eps 1e-6, which mmpretrain also gives the sr norm (1e-5 in Twins/ours).
    ours = create_model('pcpvt_small')
    ours.load_state_dict(small_sd)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = theirs(x, mode='tensor')
        got = ours(x)
    assert (got - expected).abs().max() < 1e-4


def test_deit_weights_match_timm_vit_with_identity_pegs():
    """timm's DeiT-tiny loads strictly into cpvt_tiny built as DeiT (learned table, no PEG) and gives its
    logits at the trained and at other sizes; with the table zeroed, DeiT equals CPVT with identity PEGs."""
    timm = pytest.importorskip('timm')
    deit = timm.create_model('deit_tiny_patch16_224', pretrained=False, dynamic_img_size=True).eval()
    sd = deit.state_dict()
    assert detect_layout(sd) == 'deit'
    ours = create_model('cpvt_tiny').eval()
    with pytest.raises(CheckpointMismatchError, match=r'unexpected keys \(1\): pos_embed.0'):
        load_into(ours, to_native(sd))
    with_table = create_model('cpvt_tiny', pos_encoding='learned').eval()
    load_into(with_table, sd)  # DeiT itself, strictly
    with torch.no_grad():
        for size in ((320, 288), (160, 208), (224, 224)):  # the table resized as timm does at other sizes
            x = torch.randn(2, 3, *size)
            assert (with_table(x) - deit(x)).abs().max() < 1e-4, size
    with torch.no_grad():
        deit.pos_embed.zero_()
    report = load_into(ours, deit_to_native(sd, drop_pos_embed=True), strict=False)
    assert sorted(report.missing) == sorted(k for k in ours.state_dict() if k.startswith('pos_block.'))
    assert not report.unexpected and not report.mismatched
    with torch.no_grad():
        for peg in ours.pos_block:
            peg.proj[0].weight.zero_()
            peg.proj[0].bias.zero_()
        assert (ours(x) - deit(x)).abs().max() < 1e-4
    with pytest.raises(UnknownKeysError, match='dist_token'):
        deit_to_native({**sd, 'dist_token': torch.zeros(1, 1, 192)}, drop_pos_embed=True)


@pytest.mark.parametrize('target, suffix', [('mmseg', '.pth'), ('mmpretrain', '.safetensors'),
                                            ('backbone', '.pth')])
def test_convert_checkpoint_cli(tmp_path, small_sd, target, suffix):
    """mmseg/mmpretrain files in, every layout out, and back: the weights survive unchanged."""
    from pathlib import Path
    tool = Path(__file__).resolve().parents[1] / 'tools/convert_checkpoint.py'
    src = tmp_path / 'mmseg.pth'
    torch.save({'state_dict': native_to_mmseg(small_sd), 'meta': {}}, src)
    mid, back = tmp_path / f'mid{suffix}', tmp_path / 'back.pth'
    for args in ([src, mid, '--to', target, '--check', 'pcpvt_small'], [mid, back, '--to', 'native']):
        out = run_tool([tool, *args])
        assert out.returncode == 0, out.stderr
    restored = load_weights_file(back)
    dense = {k: v for k, v in small_sd.items() if not k.startswith(('head.', 'norm.'))}
    assert set(restored) == set(dense) and all(torch.equal(restored[k], dense[k]) for k in dense)
    assert detect_layout(load_weights_file(mid)) == {'mmseg': 'mmseg', 'mmpretrain': 'mmpretrain',
                                                     'backbone': 'native'}[target]
    bad = run_tool([tool, src, tmp_path / 'x.pth', '--prefix', 'backbone.'])
    assert bad.returncode != 0 and "no key of" in bad.stderr


class ChannelScale(PositionEncoding):
    """An encoding registered by a test only: a learned per-channel scale of each stage's tokens, mounted under an
    attribute no built-in encoding uses."""
    attr, name = 'pos_scale', 'channel_scale'

    def __init__(self, geometry):
        super().__init__(geometry)
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(dim)) for dim in geometry.dims])

    def embed(self, stage, x, hw):
        return x * self.scales[stage]


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_a_registered_encoding_loads_without_converter_changes(tmp_path, name):
    """The converters take the position encodings' key roots from the registry: a new encoding's checkpoint is
    native, loads by path and inside a classifier checkpoint, and stops being recognised once unregistered."""
    with registered_encoding(ChannelScale):
        assert 'pos_scale.' in state_dict_roots()
        torch.manual_seed(0)
        model = create_model(name, pos_encoding='channel_scale')
        with torch.no_grad():
            for p in model.pos_scale.parameters():
                p.normal_()
        sd = model.state_dict()
        assert 'pos_scale.scales.0' in sd and detect_layout(sd) == 'native'
        path = tmp_path / 'w.pth'
        torch.save({'state_dict': sd}, path)
        loaded = create_model(name, pos_encoding='channel_scale', pretrained=str(path))
        assert all(torch.equal(v, sd[k]) for k, v in loaded.state_dict().items())
        wrapped = from_native(sd, 'classifier')
        assert 'backbone.pos_scale.scales.0' in wrapped and detect_layout(wrapped) == 'classifier'
        fresh = create_model(name, pos_encoding='channel_scale')
        load_into(fresh, wrapped)
        assert all(torch.equal(v, sd[k]) for k, v in fresh.state_dict().items())
    assert 'channel_scale' not in ENCODINGS and 'pos_scale.' not in state_dict_roots()
    with pytest.raises(ValueError, match='unrecognised checkpoint layout'):
        detect_layout(sd)
    with pytest.raises(UnknownKeysError, match='backbone.pos_scale.scales.0'):
        classifier_to_native(wrapped)


def test_registry_refuses_taken_names_and_restores_itself_after_an_error():
    before = dict(ENCODINGS)
    with pytest.raises(ValueError, match="name 'peg' is taken"):
        register_encoding(type('OtherPEG', (ChannelScale,), dict(name='peg')))
    with pytest.raises(RuntimeError, match='inside'), registered_encoding(ChannelScale):
        with pytest.raises(ValueError, match="'channel_scale' is taken"):
            register_encoding(ChannelScale)
        raise RuntimeError('inside')
    assert before == ENCODINGS
