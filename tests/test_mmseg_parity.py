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


def _ceil_maps(h: int, w: int) -> list[tuple[int, int]]:
    """Each stage's map at the published patch sizes 4, 2, 2, 2, as the package and mmseg make them (padded)."""
    maps = []
    for patch in (4, 2, 2, 2):
        h, w = -(-h // patch), -(-w // patch)
        maps.append((h, w))
    return maps


def equal_to_mmseg(h: int, w: int, window_mask: bool | None = None) -> bool:
    """docs/reference.md's rule for mmseg: its patch embeddings pad as ours, its key/value reductions floor, so the
    outputs are equal where every stage's map divides by its ``sr_ratio`` (8, 4, 2, 1); with windows (7), mmseg's
    mask acts only where both sides of a map are padded: ``window_mask=True`` equal where no map is padded on
    exactly one side, ``window_mask=False`` where none is padded on both."""
    maps = _ceil_maps(h, w)
    if any(side % sr for (mh, mw), sr in zip(maps, (8, 4, 2, 1), strict=True) for side in (mh, mw)):
        return False
    padded = {(mh % 7 > 0) + (mw % 7 > 0) for mh, mw in maps}
    return window_mask is None or (1 not in padded if window_mask else 2 not in padded)


def test_outputs_equal_mmseg_exactly_where_the_rule_says():
    """Both ways, on a CPU-sized pyramid: PCPVT equal at sizes that are not multiples of 32 where the padded maps
    divide (221 x 254, 223 x 96), different where they do not; SVT's windows as its mask says."""
    from mmseg.models.backbones import PCPVT, SVT
    tiny = dict(embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2), mlp_ratios=(4, 4, 4, 4))
    arch = dict(embed_dims=[16, 32, 64, 128], num_heads=[1, 2, 4, 8], mlp_ratios=[4, 4, 4, 4], depths=[2, 2, 2, 2],
                sr_ratios=[8, 4, 2, 1], qkv_bias=True, norm_after_stage=False)
    cases = []
    for mask in (None, True, False):
        if mask is None:
            ours = create_model('pcpvt_small', features_only=True, norm_eps=1e-5, **tiny).eval()
            theirs = PCPVT(**arch, patch_sizes=[4, 2, 2, 2], strides=[4, 2, 2, 2], norm_cfg=dict(type='LN')).eval()
            sizes = [(221, 254), (223, 96), (220, 224), (100, 100)]
        else:
            ours = create_model('svt_small', features_only=True, norm_eps=1e-5, window_mask=mask, **tiny).eval()
            theirs = SVT(**arch, windiow_sizes=[7, 7, 7, 7], drop_path_rate=0.).eval()
            sizes = [(96, 128), (224, 256)]
        theirs.load_state_dict(native_to_mmseg(ours.state_dict()), strict=True)
        cases += [(ours, theirs, mask, hw) for hw in sizes]
    assert {equal_to_mmseg(h, w, mask) for _, _, mask, (h, w) in cases} == {True, False}
    for ours, theirs, mask, (h, w) in cases:
        x = torch.randn(1, 3, h, w)
        with torch.no_grad():
            got, expected = ours(x), theirs(x)
        differences = [float((g - e).norm() / e.norm()) if g.shape == e.shape else 1.0
                       for g, e in zip(got, expected, strict=True)]
        assert (max(differences) < 1e-5) == equal_to_mmseg(h, w, mask), (h, w, mask, differences)
