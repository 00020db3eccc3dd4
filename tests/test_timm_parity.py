"""Our pyramid models against timm's ``twins_pcpvt_*`` on the same weights."""
import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.convert import load_into

timm = pytest.importorskip('timm')

CASES = [pytest.param('pcpvt_small', id='small'),
         pytest.param('pcpvt_base', id='base', marks=pytest.mark.heavy),
         pytest.param('pcpvt_large', id='large', marks=pytest.mark.heavy)]
SIZES = [(224, 224), (256, 352)]  # square, and a multiple of 32 that is not square


@pytest.mark.parametrize('name', CASES)
def test_logits_and_features_equal_timm(name):
    ref = timm.create_model(f'twins_{name}').eval()
    ours = create_model(name).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # same keys, same shapes
    assert set(ours.state_dict()) == set(ref.state_dict())
    dense = create_model(name, features_only=True).eval()
    report = load_into(dense, ref.state_dict())
    assert not report
    for h, w in SIZES:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-4)
            torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=0, atol=1e-4)
            expected = ref.forward_intermediates(x, intermediates_only=True)
            got = dense(x)
        assert len(got) == len(expected) == 4
        for g, e in zip(got, expected, strict=False):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-4)


def test_timm_pooled_features_equal():
    ref = timm.create_model('twins_pcpvt_small', num_classes=0).eval()
    ours = create_model('pcpvt_small', num_classes=0).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(1, 3, 160, 96)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-4)
