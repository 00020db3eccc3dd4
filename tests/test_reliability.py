"""Odd inputs, lower precision, determinism, and checkpoint writes that cannot tear."""
import os

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
