"""Odd inputs, lower precision, determinism, and checkpoint writes that cannot tear."""
import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpvt_backbones import create_model, list_models

SMALL = ['pcpvt_tiny', 'cpvt_tiny', 'cpvt_tiny_gap']
BIG = [n for n in list_models() if n not in SMALL]
_MODELS = {}


def model(name: str, features_only: bool):
    """Eval-mode models, built once per process (seeded, so every run fuzzes the same weights)."""
    key = (name, features_only)
    if key not in _MODELS:
        torch.manual_seed(0)
        _MODELS[key] = create_model(name, features_only=features_only).eval()
    return _MODELS[key]


def outputs(m, x):
    out = m(x)
    return out if isinstance(out, tuple) else (out,)


def check_outputs(m, x, features_only: bool):
    with torch.no_grad():
        out = outputs(m, x)
    B, _, H, W = x.shape
    if features_only:
        assert [tuple(o.shape) for o in out] == [(B, c, -(-H // s), -(-W // s))
                                                 for c, s in zip(m.out_channels, m.strides, strict=False)]
    else:
        assert [tuple(o.shape) for o in out] == [(B, 1000)]
    assert all(torch.isfinite(o).all() for o in out)


SIZES = st.tuples(st.integers(1, 3), st.integers(1, 600), st.integers(1, 600))
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@settings(FUZZ, max_examples=40)
@given(name=st.sampled_from(SMALL), features_only=st.booleans(), bhw=SIZES)
def test_fuzz_sizes_small_models(name, features_only, bhw):
    b, h, w = bhw
    check_outputs(model(name, features_only), torch.randn(b, 3, h, w), features_only)


@pytest.mark.heavy
@settings(FUZZ, max_examples=24)
@given(name=st.sampled_from(BIG), features_only=st.booleans(), bhw=SIZES)
def test_fuzz_sizes_every_model(name, features_only, bhw):
    b, h, w = bhw
    check_outputs(model(name, features_only), torch.randn(b, 3, h, w), features_only)


@pytest.mark.parametrize('name', SMALL)
@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_check_finite_is_opt_in(name, bad):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 37, 45)
    x[1, 2, 5, 7] = bad
    checked = create_model(name, features_only=True, check_finite=True).eval()
    with pytest.raises(ValueError, match=r'contains 1 NaN or Inf values.*check_finite=True'):
        checked(x)
    checked(x.nan_to_num())  # finite input passes
    unchecked = create_model(name, features_only=True).eval()
    assert unchecked.check_finite is False
    with torch.no_grad():
        unchecked(x)  # off by default: no pass over the input, no error


def test_check_finite_through_adapters():
    pytest.importorskip('mmdet')
    from mmdet.registry import MODELS

    import cpvt_backbones.adapters.mmdet  # noqa: F401
    backbone = MODELS.build(dict(type='PyramidCPVT', arch=dict(base='pcpvt_tiny', check_finite=True)))
    with pytest.raises(ValueError, match='NaN or Inf'):
        backbone(torch.full((1, 3, 32, 32), float('nan')))


@pytest.mark.parametrize('name', SMALL)
@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
def test_memory_format_and_strides_do_not_matter(name, train):
    torch.manual_seed(0)
    m = create_model(name, features_only=True).train(train)
    x = torch.randn(2, 3, 70, 53)
    variants = {
        'channels_last': x.contiguous(memory_format=torch.channels_last),
        'transposed': x.transpose(2, 3).contiguous().transpose(2, 3),
        'strided': torch.randn(2, 3, 140, 53)[:, :, ::2].copy_(x),
        'sliced_channels': torch.randn(2, 5, 70, 53)[:, 1:4].copy_(x),
    }
    with torch.set_grad_enabled(train):
        ref = m(x)
        for label, v in variants.items():
            assert not v.is_contiguous() or label == 'channels_last'
            for a, b in zip(ref, m(v), strict=False):
                assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (label, (a - b).abs().max())


@pytest.mark.parametrize('name', SMALL)
def test_bitwise_deterministic_in_eval(name):
    m = model(name, True)
    x = torch.randn(2, 3, 97, 131)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            a, b = m(x), m(x)
        assert all(torch.equal(p, q) for p, q in zip(a, b, strict=False))


# bf16 keeps 8 bits of mantissa: activations carry ~0.4% relative error per rounding, which accumulates over
# a network's dozens of matmuls to 0.5-1.3% of the output's norm here (measured on the four small models).
BF16_REL_TOL = 0.03


@pytest.mark.parametrize('name', SMALL)
def test_bf16_autocast_forward_and_backward(name):
    torch.manual_seed(0)
    m = create_model(name, features_only=True).train()
    x = torch.randn(2, 3, 97, 131)
    ref = m(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = m(x)
    sum(o.float().mean() for o in out).backward()
    assert any(o.dtype == torch.bfloat16 for o in out)  # autocast ran the convolutions/matmuls in bf16
    # (a map straight after a LayerNorm, which autocast keeps in fp32, stays fp32)
    for a, b in zip(ref, out, strict=True):
        assert torch.isfinite(b).all()
        rel = ((b.float() - a).norm() / a.norm()).item()
        assert rel < BF16_REL_TOL, rel
    grads = [p.grad for p in m.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    m.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        assert all(torch.isfinite(o).all() for o in m(x))


def test_checkpoint_write_is_all_or_nothing(tmp_path, monkeypatch):
    pytest.importorskip('mmengine')
    from mmengine.fileio import get_file_backend
    from mmengine.runner import save_checkpoint

    from cpvt_backbones.adapters import checkpoint as ckpt_module
    from cpvt_backbones.convert import safe_load

    path = tmp_path / 'iter_3.pth'
    save_checkpoint({'state_dict': {'w': torch.ones(3)}}, str(path))
    good = path.read_bytes()
    assert isinstance(get_file_backend(str(path)), ckpt_module.AtomicLocalBackend)
    (tmp_path / 'plain').write_bytes(b'')  # a file created the ordinary way: the mode the umask gives
    assert oct(path.stat().st_mode & 0o777) == oct((tmp_path / 'plain').stat().st_mode & 0o777)
    (tmp_path / 'plain').unlink()

    def crash(fd):
        raise OSError('disk full (simulated)')

    monkeypatch.setattr(os, 'fsync', crash)
    with pytest.raises(OSError, match='simulated'):
        save_checkpoint({'state_dict': {'w': torch.zeros(1000)}}, str(path))
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ['iter_3.pth']  # no partial file left behind
    monkeypatch.undo()
    loaded = safe_load(path)
    assert torch.equal(loaded['state_dict']['w'], torch.ones(3))


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


def test_mmengine_refuses_a_checkpoint_that_runs_code_on_every_stack(tmp_path):
    """With the checkpoint opt-in, mmengine's own loading (what --resume, load_from and tools/test.py use) refuses
    a pickle that would run code, whatever this torch's and this mmengine's defaults (the OneDL fork retries
    with weights_only=False; mmengine 0.10.7 on torch < 2.6 loads anything), and loads a checkpoint with
    mmengine's log buffers and numpy scalars."""
    pytest.importorskip('mmengine')
    import pickle

    import numpy as np
    from mmengine.logging import HistoryBuffer
    from mmengine.runner import CheckpointLoader, load_checkpoint, save_checkpoint

    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in)

    marker, evil = tmp_path / 'ran', tmp_path / 'evil.pth'
    net = torch.nn.Linear(2, 2)
    torch.save({'state_dict': net.state_dict(), 'meta': _RunsCode(marker)}, evil)
    for load in (lambda: load_checkpoint(net, str(evil)), lambda: CheckpointLoader.load_checkpoint(str(evil))):
        with pytest.raises(pickle.UnpicklingError, match='posix.system'):
            load()
    assert not marker.exists()
    good = tmp_path / 'good.pth'
    buffer = HistoryBuffer()
    buffer.update(0.5)
    save_checkpoint({'state_dict': net.state_dict(), 'message_hub': {'loss': buffer, 'lr': np.float64(1e-3)}},
                    str(good))
    loaded = CheckpointLoader.load_checkpoint(str(good))
    assert loaded['message_hub']['lr'] == 1e-3 and loaded['message_hub']['loss'].current() == 0.5
    load_checkpoint(net, str(good))


# --- checkpoints carried between numpy 1.x and numpy 2 -------------------------------------------------------------

def numpy_payload():
    """What mmengine checkpoints and RNG hooks hold of numpy: scalars, arrays, dtypes and numpy's generator states."""
    import numpy as np
    return {'state_dict': {'w': torch.arange(6.).view(2, 3)},
            'meta': {'lr': np.float64(1e-3), 'iter': np.int64(7), 'flag': np.bool_(True), 'dtype': np.dtype('float32'),
                     'mean': np.array([0.5, 0.25], dtype=np.float32), 'numpy_rng': np.random.RandomState(3).get_state(),
                     'generator': np.random.default_rng(3).bit_generator.state}}


def numpy_bytes(obj, major: int, edit=lambda data: data) -> bytes:
    """``torch.save(obj)`` as numpy ``major`` (1 or 2) writes it, whichever numpy is installed: numpy 1.x names
    numpy's core module ``numpy.core``, numpy 2 ``numpy._core`` (the same pickle otherwise: protocol 2 names a
    global by a text line, so the rename is a byte edit of the pickle), in torch's zip format; ``edit`` changes
    the pickle further."""
    import io as bytes_io
    import zipfile
    buffer = bytes_io.BytesIO()
    torch.save(obj, buffer)
    old, new = (b'cnumpy._core.', b'cnumpy.core.') if major == 1 else (b'cnumpy.core.', b'cnumpy._core.')
    out = bytes_io.BytesIO()
    with zipfile.ZipFile(bytes_io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(out, 'w') as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith('data.pkl'):
                data = data.replace(old, new)
                assert new + b'multiarray' in data and old not in data
                data = edit(data)
            dst.writestr(item, data)
    return out.getvalue()


def numpy1_bytes(obj, edit=lambda data: data) -> bytes:
    """``torch.save(obj)`` as numpy 1.x writes it (``numpy_bytes``)."""
    return numpy_bytes(obj, 1, edit)


@pytest.fixture(params=['torch weights_only', 'restricted unpickler'])
def numpy_loader(request, monkeypatch):
    """``safe_load`` with numpy's data types allowed (what the checkpoint opt-in registers), both ways it works."""
    import numpy as np

    from cpvt_backbones.convert import io
    core = np._core if hasattr(getattr(np, '_core', None), 'multiarray') else np.core  # numpy 2, or numpy 1.x
    dtypes = [type(np.dtype(t)) for t in ('float64', 'float32', 'int64', 'uint32', 'bool')]
    monkeypatch.setattr(io, '_ALLOWED', [core.multiarray.scalar, core.multiarray._reconstruct, np.ndarray, np.dtype,
                                         *dtypes])
    if request.param == 'restricted unpickler':
        monkeypatch.setattr(io, 'supports', lambda feature: False)
    elif not io.supports('safe_globals'):
        pytest.skip(f'torch {torch.__version__} has no torch.serialization.safe_globals (torch >= 2.5)')
    return request.param


def same_payload(loaded, expected) -> None:
    import numpy as np
    meta, want = loaded['meta'], expected['meta']
    assert torch.equal(loaded['state_dict']['w'], expected['state_dict']['w'])
    assert meta['lr'] == want['lr'] and type(meta['lr']) is np.float64 and meta['iter'] == 7 and meta['flag']
    assert meta['dtype'] == np.float32 and np.array_equal(meta['mean'], want['mean'])
    name, keys, pos, has_gauss, gauss = meta['numpy_rng']
    assert name == 'MT19937' and np.array_equal(keys, want['numpy_rng'][1]) and keys.dtype == np.uint32
    assert (pos, has_gauss, gauss) == tuple(want['numpy_rng'][2:]) and meta['generator'] == want['generator']
    restored = np.random.RandomState()
    restored.set_state(meta['numpy_rng'])
    assert restored.rand() == np.random.RandomState(3).rand()


def test_checkpoints_written_on_numpy_1_load_on_numpy_2_and_the_reverse(tmp_path, numpy_loader):
    """The safe loader reads numpy's data types under numpy 1.x's names (numpy.core...) and numpy 2's
    (numpy._core...), on both of its paths; nothing else is allowed by the mapping: a code-running global is
    still refused, and so is a numpy function outside the data types under either spelling."""
    from cpvt_backbones.convert import io, safe_load
    payload = numpy_payload()
    old, new = tmp_path / 'numpy1.pth', tmp_path / 'numpy2.pth'
    old.write_bytes(numpy_bytes(payload, 1))
    new.write_bytes(numpy_bytes(payload, 2))
    for path in (old, new):
        same_payload(safe_load(path), payload)
    for name in ('numpy.core.multiarray.scalar', 'numpy._core.multiarray.scalar', 'numpy.core.multiarray._reconstruct',
                 'numpy._core.multiarray._reconstruct'):
        assert any(name in io.global_names(obj) for obj in io._ALLOWED), name

    class Numpy1Function:  # how an object of numpy 1 names itself: the reverse mapping
        __module__, __qualname__ = 'numpy.core.multiarray', 'scalar'
    assert io.global_names(Numpy1Function) == ['numpy.core.multiarray.scalar', 'numpy._core.multiarray.scalar']
    import pickle
    for spelling in ('numpy.core', 'numpy._core'):
        refused = tmp_path / 'refused.pth'
        rename = f'c{spelling}.multiarray\nfromstring'.encode()
        refused.write_bytes(numpy1_bytes({'x': __import__('numpy').float64(1.)},
                                         lambda data, new=rename: data.replace(b'cnumpy.core.multiarray\nscalar', new)))
        with pytest.raises(pickle.UnpicklingError, match=f'{spelling}.multiarray.fromstring'):
            safe_load(refused)
    marker = tmp_path / 'ran'
    evil = tmp_path / 'evil.pth'
    torch.save({'numpy': payload['meta']['lr'], 'payload': _RunsCode(marker)}, evil)
    with pytest.raises(pickle.UnpicklingError, match='posix.system'):
        safe_load(evil)
    assert not marker.exists()


def test_an_mmengine_checkpoint_written_on_numpy_1_loads_through_mmengine(tmp_path):
    """With the checkpoint opt-in (every config here, tools/test.py): mmengine's own loader reads a checkpoint of
    numpy 1's names with its log buffers."""
    pytest.importorskip('mmengine')
    from mmengine.logging import HistoryBuffer
    from mmengine.runner import CheckpointLoader

    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in)
    buffer = HistoryBuffer()
    buffer.update(0.5)
    payload = numpy_payload()
    payload['message_hub'] = {'loss': buffer}
    path = tmp_path / 'iter_3.pth'
    path.write_bytes(numpy1_bytes(payload))
    loaded = CheckpointLoader.load_checkpoint(str(path))
    same_payload(loaded, payload)
    assert loaded['message_hub']['loss'].current() == 0.5


# --- errors that name the problem and the fix ----------------------------------------------------------------------

def test_a_refused_pickle_never_advises_loading_it_unsafely(tmp_path, numpy_loader):
    import pickle

    from cpvt_backbones.convert import load_weights_file, safe_load
    evil = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'payload': _RunsCode(tmp_path / 'ran')}, evil)
    for load, error in ((safe_load, pickle.UnpicklingError), (load_weights_file, ValueError)):
        with pytest.raises(error) as info:
            load(evil)
        message = str(info.value)
        assert 'posix.system' in message and 'weights_only=False' not in message, message
        assert 'add_safe_globals' not in message and 'tools/convert_checkpoint.py' in message, message
        assert '\n' not in message


def test_non_finite_weights_are_refused_by_key_unless_asked_for(tmp_path):
    from cpvt_backbones.convert import load_into, load_pretrained
    from cpvt_backbones.convert.loading import NonFiniteWeightsError
    torch.manual_seed(0)
    model = create_model('pcpvt_tiny')
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state['blocks.0.0.attn.q.weight'][0, 0] = float('nan')
    state['head.bias'][3] = float('inf')
    path = tmp_path / 'diverged.pth'
    torch.save(state, path)
    fresh = create_model('pcpvt_tiny')
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    says = r'NaN or Inf values in 2 tensor\(s\) \(nothing was loaded\): blocks\.0\.0\.attn\.q\.weight, head\.bias\.'
    with pytest.raises(NonFiniteWeightsError, match=says + '.*allow_nonfinite=True'):
        load_pretrained(fresh, path)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())
    load_into(fresh, state, allow_nonfinite=True)
    assert torch.isnan(fresh.blocks[0][0].attn.q.weight[0, 0])
    with pytest.raises(NonFiniteWeightsError):
        create_model('pcpvt_tiny', pretrained=str(path))
    asked = create_model('pcpvt_tiny', pretrained=str(path), allow_nonfinite=True)
    assert torch.isnan(asked.blocks[0][0].attn.q.weight[0, 0]) and torch.isinf(asked.head.bias[3])
    pytest.importorskip('mmengine')
    from cpvt_backbones.adapters.runner import refuse_unfit
    with pytest.raises(NonFiniteWeightsError, match='checkpoint c.pth holds NaN or Inf'):
        refuse_unfit(model, {'state_dict': state}, 'checkpoint c.pth')
    refuse_unfit(model, {'state_dict': state}, 'checkpoint c.pth', allow_nonfinite=True)


def test_an_unknown_backbone_setting_in_a_config_lists_the_valid_ones():
    pytest.importorskip('mmengine')
    from mmengine.config import Config

    from cpvt_backbones.adapters.runner import ConfigError, check_backbone_settings
    cfg = Config(dict(model=dict(backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny', drop_path_rte=0.1))))
    with pytest.raises(ConfigError, match=r"x\.py: model\.backbone \(PyramidCPVT\) has no setting\(s\) "
                                          r"\['drop_path_rte'\]; valid settings: \[.*'drop_path_rate'.*\]"):
        check_backbone_settings(cfg, 'x.py')
    cfg = Config(dict(model=dict(backbone=dict(type='mmdet.CPVT', arch=dict(base='cpvt_tiny', dpeth=3)))))
    with pytest.raises(ConfigError, match=r"model\.backbone\.arch: CPVT has no argument\(s\) \['dpeth'\]; "
                                          r"valid arguments: \[.*'depth'"):
        check_backbone_settings(cfg)
    check_backbone_settings(Config(dict(model=dict(backbone=dict(type='PyramidCPVT', arch='pcpvt_tiny',
                                                                 drop_path_rate=0.1)))))
    check_backbone_settings(Config(dict(model=dict(backbone=dict(type='ResNet', depth=50, whatever=1)))))



def test_a_cfg_option_under_a_model_name_names_the_fix(tmp_path):
    """``--cfg-options model.backbone.arch.depths=...`` where the config names the model (``arch='pcpvt_tiny'``):
    a ConfigError naming the key, the name and the options that work (mmengine's merge raised a TypeError); those
    options (as ``DictAction`` parses them) then build the settings they say; a key below any other plain value is
    refused the same way."""
    pytest.importorskip('mmengine')
    from cpvt_backbones.adapters.runner import ConfigError, load_config
    config = str(Path(__file__).resolve().parents[1] / 'configs/shapes/fpn_pcpvt-tiny_shapes.py')
    with pytest.raises(ConfigError) as info:
        load_config(config, {'model.backbone.arch.depths': [1, 1, 1, 1]}, str(tmp_path))
    assert str(info.value) == (
        f"{config}: --cfg-options model.backbone.arch.depths: model.backbone.arch is the model name 'pcpvt_tiny', "
        "which has no setting 'depths'; make it a dict based on that name: --cfg-options "
        "model.backbone.arch._delete_=True model.backbone.arch.base=pcpvt_tiny model.backbone.arch.depths=...")
    cfg = load_config(config, {'model.backbone.arch._delete_': True, 'model.backbone.arch.base': 'pcpvt_tiny',
                               'model.backbone.arch.depths': [1, 1, 1, 1]}, str(tmp_path))
    assert cfg.model.backbone.arch == dict(base='pcpvt_tiny', depths=[1, 1, 1, 1])
    with pytest.raises(ConfigError, match=r"model\.backbone\.drop_path_rate is 0\.0 \(float\), not a dict, so it "
                                          r"has no 'x' to set"):
        load_config(config, {'model.backbone.drop_path_rate.x': 1}, str(tmp_path))

# --- prepare: never in place, int8 only with calibration ---------------------------------------------------------

def _tiny_backbone(seed=0, **kwargs):
    from cpvt_backbones.models import PyramidCPVT
    torch.manual_seed(seed)
    settings = dict(embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), mlp_ratios=(2, 2), sr_ratios=(2, 1),
                    patch_sizes=(4, 2), features_only=True, num_classes=0)  # two stages: quick to export
    return PyramidCPVT(**{**settings, **kwargs}).eval()


def _relative(got, ref):
    return max(float((g - r).norm() / r.norm()) for g, r in zip(got, ref, strict=True))


def test_prepare_never_changes_its_argument_and_refuses_a_prepared_module():
    """``prepare(m, 'fused')`` returns a new module and leaves ``m`` plain; a prepared module is refused, naming
    what it holds; int8 without calibration batches (None, an empty list, an iterator that yields nothing) is
    refused; int8 on the untouched argument then is int8 indeed."""
    from cpvt_backbones.deploy import prepare
    from cpvt_backbones.deploy.kernels import KERNELS, FusedBlock
    model = _tiny_backbone()
    kinds = [type(m) for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fused = prepare(model, 'fused')
    assert fused is not model and [type(m) for m in model.modules()] == kinds
    assert any(isinstance(m, FusedBlock) for m in fused.modules())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"prepared for an engine already \(it holds the fused engine's FusedBlock "
                                         r"at 'blocks\.0\.0'\); prepare the plain model"):
        prepare(fused, 'fused', 'int8', calibration=[x])
    from cpvt_backbones.deploy.engines.torch import AutocastModule  # built directly: bf16 native here or not
    with pytest.raises(ValueError, match="prepared for an engine already.*the torch engine's "
                                         "ValidSizesAutocastModule"):
        prepare(AutocastModule(model), 'fused')
    for empty, says in ((None, 'pass calibration='), ([], 'calibration is empty')):
        with pytest.raises(ValueError, match=says):
            prepare(model, 'fused', 'int8', calibration=empty)
    if not KERNELS['onednn_int8'].available():
        pytest.skip('the int8 half: the oneDNN int8 kernel is not available on this CPU/torch')
    with pytest.raises(ValueError, match='calibration is empty'):   # an iterator: read when the request is made
        prepare(model, 'fused', 'int8', calibration=iter(()))
    int8 = prepare(model, 'fused', 'int8', calibration=[torch.randn(2, 3, 64, 64) for _ in range(2)])
    with torch.no_grad():
        ref, fast, low = model(x), fused(x), int8(x)
    assert _relative(fast, ref) < 1e-4 and 1e-4 < _relative(low, ref) < 0.1  # really int8, not float32 again


def _engine_cache_cases():
    from cpvt_backbones.deploy import ENGINES
    for name in ('onnxruntime', 'openvino'):
        missing = ENGINES[name].missing()
        marks = [pytest.mark.skipif(bool(missing), reason=f'engine {name!r} needs {", ".join(missing)}')]
        yield pytest.param(name, marks=marks)


@pytest.mark.heavy
@pytest.mark.parametrize('engine', list(_engine_cache_cases()))
def test_an_engine_cache_made_from_another_model_is_never_run(engine, tmp_path):
    """A cache written for one model and asked for with another (other weights; other out_indices) is detected by
    what its record says it was made from, converted again with a warning, and the outputs are this model's."""
    from cpvt_backbones.compat import supports
    from cpvt_backbones.deploy import prepare
    if not supports('export'):
        pytest.skip('the converting engines export with torch.export (torch >= 2.6)')
    cache = str(tmp_path / 'cache')
    first, other, fewer = _tiny_backbone(0), _tiny_backbone(1), _tiny_backbone(0, out_indices=(1,))
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    prepare(first, engine, cache=cache)
    for model in (other, fewer):
        with pytest.warns(RuntimeWarning, match=f'{engine} cache .*made from another model.*making it again'):
            prepared = prepare(model, engine, cache=cache)
        with torch.no_grad():
            ref = model(x)
            got = prepared(x)
        assert len(got) == len(ref) and _relative(got, ref) < 1e-3
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the cache now holds this model's conversion: read back without a word
        prepare(fewer, engine, cache=cache)


def test_fused_int8_ranges_saved_for_another_model_are_calibrated_again(tmp_path):
    """The fused engine's calibrated ranges are an artifact like any other: read back for the model and batches
    they were calibrated on (the model is then not run on them), calibrated again with a warning for another."""
    from cpvt_backbones.deploy import prepare
    from cpvt_backbones.deploy.kernels import KERNELS
    if not KERNELS['onednn_int8'].available():
        pytest.skip('the fused int8 engine: the oneDNN int8 kernel is not available on this CPU/torch')
    batches = [torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    cache, saved = str(tmp_path / 'model'), tmp_path / 'model.ranges.json'
    prepare(_tiny_backbone(0), 'fused', 'int8', calibration=batches, cache=cache)
    first, stamp = saved.read_text(), saved.stat().st_mtime_ns
    assert json.loads(Path(f'{saved}.record.json').read_text())['calibration']['images'] == 2
    again = _tiny_backbone(0)
    again.register_forward_pre_hook(lambda *_: pytest.fail('calibrated again'))
    prepare(again, 'fused', 'int8', calibration=batches, cache=cache)
    assert saved.stat().st_mtime_ns == stamp
    with pytest.warns(RuntimeWarning, match='fused cache .*model.ranges.json: it was made from another model.*making '
                                            'it again'):
        prepare(_tiny_backbone(1), 'fused', 'int8', calibration=batches, cache=cache)
    assert saved.read_text() != first
