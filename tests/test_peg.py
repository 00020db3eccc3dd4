"""What the paper claims of the PEG, checked on the module and in a model."""
import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.layers import PEG
from cpvt_backbones.layers.position import Geometry, PEGEncoding


def _peg(dim=8, k=3, peg_type='depthwise'):
    peg = PEG(dim, k, peg_type)
    torch.nn.init.normal_(peg.proj[0].weight)
    return peg.eval()


def test_residual_and_parameter_count():
    peg = PEG(192, 3)
    assert sum(p.numel() for p in peg.parameters()) == 192 * 9 + 192  # the paper's count
    torch.nn.init.zeros_(peg.proj[0].weight)
    torch.nn.init.zeros_(peg.proj[0].bias)
    x = torch.randn(2, 5 * 7, 192)
    assert torch.equal(peg(x, (5, 7)), x)  # a zero convolution leaves only the residual


def test_separable_adds_pointwise():
    peg = PEG(16, 5, 'separable')
    assert [tuple(c.weight.shape) for c in peg.proj] == [(16, 1, 5, 5), (16, 16, 1, 1)]


def test_permuting_tokens_changes_output():
    peg = _peg()
    x = torch.randn(1, 6 * 6, 8)
    perm = torch.randperm(36)
    assert not torch.allclose(peg(x[:, perm], (6, 6)), peg(x, (6, 6))[:, perm], atol=1e-3)


def test_translation_equivariant_away_from_border():
    """Content inside a zero border, shifted by (dy, dx): the output shifts by the same amount."""
    peg = _peg(k=5)
    canvas = torch.zeros(1, 8, 20, 24)
    canvas[..., 4:10, 5:12] = torch.randn(1, 8, 6, 7)
    shifted = torch.roll(canvas, shifts=(3, 5), dims=(2, 3))

    def run(m):
        return peg(m.flatten(2).transpose(1, 2), (20, 24)).transpose(1, 2).reshape(1, 8, 20, 24)

    torch.testing.assert_close(run(shifted), torch.roll(run(canvas), shifts=(3, 5), dims=(2, 3)))


def test_zero_padding_encodes_absolute_position():
    """A constant input gives different outputs at the corners and in the centre: only the zero padding can
    tell them apart."""
    peg = _peg()
    out = peg(torch.ones(1, 9 * 9, 8), (9, 9)).transpose(1, 2).reshape(1, 8, 9, 9)
    centre = out[..., 4, 4]
    torch.testing.assert_close(out[..., 3:6, 3:6], centre[..., None, None].expand(-1, -1, 3, 3))
    for corner in (out[..., 0, 0], out[..., 0, -1], out[..., -1, 0], out[..., -1, -1]):
        assert not torch.allclose(corner, centre)


def test_class_token_bypasses():
    peg = _peg()
    with_cls = PEG(8, 3, num_prefix_tokens=1)
    with_cls.load_state_dict(peg.state_dict())
    x = torch.randn(2, 1 + 16, 8)
    y = with_cls(x, (4, 4))
    assert torch.equal(y[:, 0], x[:, 0])
    torch.testing.assert_close(y[:, 1:], peg(x[:, 1:], (4, 4)))


@pytest.mark.parametrize('k', [2, 0, 4])
def test_even_kernel_rejected(k):
    with pytest.raises(ValueError, match='odd'):
        PEG(8, k)


@pytest.mark.parametrize('k', [1, 2, 4])
def test_peg_encoding_needs_a_window(k):
    """A 1 x 1 kernel is the paper's no-locality control (``conv1x1``), not a PEG."""
    with pytest.raises(ValueError, match='odd and >= 3'):
        PEGEncoding(Geometry((8,), (2,), (1,), (4,), (1,)), kernel_size=k)


def test_model_is_permutation_sensitive_only_with_peg():
    """Shuffling 16x16 patches leaves a GAP transformer without position encoding unchanged; with PEGs
    the prediction changes: the PEG is what gives the model position."""
    x = torch.randn(1, 3, 64, 64)
    patches = x.unfold(2, 16, 16).unfold(3, 16, 16)  # 1, 3, 4, 4, 16, 16
    perm = torch.randperm(16)
    shuffled = patches.reshape(1, 3, 16, 16, 16)[:, :, perm].reshape(1, 3, 4, 4, 16, 16)
    shuffled = shuffled.permute(0, 1, 2, 4, 3, 5).reshape(1, 3, 64, 64)
    for encoding, invariant in (('none', True), (dict(type='peg', positions=(0,)), False)):
        model = create_model('cpvt_tiny_gap', pos_encoding=encoding, depth=2).eval()
        with torch.no_grad():
            same = torch.allclose(model(x), model(shuffled), atol=1e-5)
        assert same is invariant


def test_circular_padding_keeps_locality_without_a_border():
    """On a constant map a zero-padded PEG marks the border ring; one that pads circularly (or by replication)
    adds the same to every token, so it holds no absolute position, yet it still mixes neighbours; the encoding
    passes the mode to every PEG and names it."""
    torch.manual_seed(0)
    x = torch.ones(1, 7 * 9, 8)
    zero = PEG(8)
    for mode in ('circular', 'replicate'):
        peg = PEG(8, padding_mode=mode)
        peg.load_state_dict(zero.state_dict())
        out = peg(x, (7, 9))
        assert torch.allclose(out, out[:, :1].expand_as(out), atol=1e-6)
        assert not torch.allclose(zero(x, (7, 9)), zero(x, (7, 9))[:, :1].expand_as(x), atol=1e-3)
        ramp = torch.arange(7 * 9, dtype=torch.float32)[None, :, None].expand(1, -1, 8)
        assert not torch.allclose(peg(ramp, (7, 9)) - ramp, (peg(ramp, (7, 9)) - ramp)[:, :1].expand_as(ramp))
    encoding = PEGEncoding(Geometry((8,), (2,), (1,), (4,), (1,)), padding_mode='circular')
    assert all(conv.padding_mode == 'circular' for conv in encoding.modules() if isinstance(conv, torch.nn.Conv2d))
    assert 'circular padding' in encoding.extra_repr()
    with pytest.raises(ValueError, match='padding_mode'):
        PEG(8, padding_mode='mirror')
    model = create_model('cpvt_tiny_gap', pos_encoding=dict(type='peg', padding_mode='circular'), num_classes=3)
    assert model(torch.randn(1, 3, 33, 47)).shape == (1, 3)
