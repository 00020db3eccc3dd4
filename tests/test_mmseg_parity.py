"""Our dense backbone against mmseg's own ``PCPVT`` on the same weights, through mmseg's key layout.

mmseg hard-codes LayerNorm eps 1e-5 inside its encoder layers (the official Twins blocks use 1e-6), so the
comparison builds ours with ``norm_eps=1e-5``; everything else is the default model.
"""
import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.convert import load_into, native_to_mmseg

pytest.importorskip('mmseg')


def _mmseg_pcpvt(depths):
    from mmseg.models.backbones import PCPVT
    return PCPVT(embed_dims=[64, 128, 320, 512], patch_sizes=[4, 2, 2, 2], strides=[4, 2, 2, 2],
                 num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4], out_indices=(0, 1, 2, 3), qkv_bias=True,
                 norm_cfg=dict(type='LN'), depths=list(depths), sr_ratios=[8, 4, 2, 1],
                 norm_after_stage=False)


@pytest.mark.parametrize('name, depths', [
    ('pcpvt_small', (3, 4, 6, 3)),
    pytest.param('pcpvt_base', (3, 4, 18, 3), marks=pytest.mark.heavy)])
def test_features_equal_mmseg(name, depths):
    ours = create_model(name, features_only=True, norm_eps=1e-5).eval()
    theirs = _mmseg_pcpvt(depths).eval()
    theirs.load_state_dict(native_to_mmseg(ours.state_dict()), strict=True)
    for h, w in [(224, 224), (256, 352)]:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            for a, b in zip(ours(x), theirs(x), strict=False):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_mmseg_weights_load_into_ours():
    """The other direction: mmseg-initialised weights, converted by our pure function, give equal features."""
    theirs = _mmseg_pcpvt((3, 4, 6, 3))
    theirs.init_weights()
    theirs.eval()
    ours = create_model('pcpvt_small', features_only=True, norm_eps=1e-5).eval()
    assert not load_into(ours, theirs.state_dict())
    x = torch.randn(1, 3, 160, 224)
    with torch.no_grad():
        for a, b in zip(ours(x), theirs(x), strict=False):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
