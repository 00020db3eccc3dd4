"""Our pyramids against timm's ``twins_pcpvt_*`` / ``twins_svt_*``, and CPVT's RoPE variants against timm's RoPE
ViTs, on the same weights: equal outputs wherever docs/reference.md's rule says so, and elsewhere the difference it
documents (timm drops what does not divide, the package pads and keeps every pixel)."""
import pytest
import torch

from cpvt_backbones import PyramidCPVT, TwinsSVT, create_model
from cpvt_backbones.convert import load_into, rope_vit_to_native

timm = pytest.importorskip('timm')

CASES = [pytest.param('pcpvt_small', id='pcpvt-small'),
         pytest.param('svt_small', id='svt-small'),
         pytest.param('pcpvt_base', id='pcpvt-base', marks=pytest.mark.heavy),
         pytest.param('pcpvt_large', id='pcpvt-large', marks=pytest.mark.heavy)]
# Square; a non-square multiple of 32; and one whose SVT maps are padded to whole windows in every stage but the
# last (24 x 40, 12 x 20, 6 x 10, 3 x 5 tokens): windows take no part in the rule.
SIZES = [(224, 224), (256, 352), (96, 160)]
# A CPU-sized pyramid (every part of the small models, two blocks per stage: SVT's windowed and global).
TINY = dict(embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2), mlp_ratios=(2, 2, 2, 2),
            num_classes=10)


def equal_to_timm(h: int, w: int, patch_sizes=(4, 2, 2, 2), sr_ratios=(8, 4, 2, 1)) -> bool:
    """docs/reference.md's rule: timm (as the Twins release) floors every patch embedding and every key/value
    reduction where the package pads, so the outputs are equal exactly where, on each side, every stage's patch
    size divides the map it embeds and every stage's ``sr_ratio`` divides the stage's map: with the published
    settings, where H and W are multiples of 32."""
    for side in (h, w):
        for patch, sr in zip(patch_sizes, sr_ratios, strict=True):
            if side % patch or (side // patch) % sr:
                return False
            side //= patch
    return True


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _timm_twins(name: str) -> torch.nn.Module:
    return timm.create_model(f'twins_{name}').eval()


@pytest.mark.parametrize('name', CASES)
def test_logits_and_features_equal_timm(name):
    ref = _timm_twins(name)
    ours = create_model(name).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # same keys, same shapes
    assert set(ours.state_dict()) == set(ref.state_dict())
    dense = create_model(name, features_only=True).eval()
    report = load_into(dense, ref.state_dict())
    assert not report
    for h, w in SIZES:
        assert equal_to_timm(h, w)
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-4)
            torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=0, atol=1e-4)
            expected = ref.forward_intermediates(x, intermediates_only=True)
            got = dense(x)
        assert len(got) == len(expected) == 4
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-4)


def test_timm_pooled_features_equal():
    ref = timm.create_model('twins_pcpvt_small', num_classes=0).eval()
    ours = create_model('pcpvt_small', num_classes=0).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(1, 3, 160, 96)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-4)


@pytest.mark.parametrize('svt', [False, True], ids=['pcpvt', 'svt'])
def test_outputs_equal_timm_exactly_where_the_rule_says(svt):
    """Both ways: equal logits at every size of the grid the rule admits (square or not), different ones at every
    other (a side that is not a multiple of 4, of 8 or of 32, on one side or both)."""
    from timm.models.twins import Twins
    ref = Twins(**TINY, sr_ratios=(8, 4, 2, 1), wss=(7, 7, 7, 7) if svt else None).eval()
    ours = (TwinsSVT if svt else PyramidCPVT)(**TINY).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    sizes = [(32, 32), (64, 96), (96, 64), (160, 224), (32, 100), (100, 64), (102, 102), (112, 112), (60, 64),
             (97, 131), (136, 96)]
    assert {equal_to_timm(*hw) for hw in sizes} == {True, False}
    for h, w in sizes:
        x = torch.randn(1, 3, h, w)
        with torch.no_grad():
            difference = rel_l2(ours(x), ref(x))
        assert (difference < 1e-5) if equal_to_timm(h, w) else (difference > 1e-4), (h, w, difference)


def test_at_an_odd_size_the_package_keeps_the_larger_map():
    """Twins-SVT-S at 112 x 112: every stage's map differs from timm's (the stride-4 one by its sub-sampled keys:
    28 tokens per side over 8, which timm floors to 3 keys and the package pads to 4), and the last map is
    ceil(112 / 32) = 4 x 4 tokens here against timm's floor, 3 x 3. Prints the relative L2 difference per stage
    (on the part both maps cover), the example docs/reference.md quotes."""
    name, (h, w) = 'svt_small', (112, 112)
    assert not equal_to_timm(h, w)
    ref = _timm_twins(name)
    dense = create_model(name, features_only=True).eval()
    assert not load_into(dense, ref.state_dict())
    x = torch.randn(1, 3, h, w)
    with torch.no_grad():
        ours, theirs = dense(x), ref.forward_intermediates(x, intermediates_only=True)
    assert [tuple(m.shape[-2:]) for m in ours] == [(28, 28), (14, 14), (7, 7), (4, 4)]
    assert [tuple(m.shape[-2:]) for m in theirs] == [(28, 28), (14, 14), (7, 7), (3, 3)]
    differences = [rel_l2(a[..., :b.shape[-2], :b.shape[-1]], b) for a, b in zip(ours, theirs, strict=True)]
    print(f'\n{name} {h}x{w}, relative L2 against timm per stage:', ' '.join(f'{d:.4f}' for d in differences))
    assert all(d > 1e-3 for d in differences), differences


def test_the_package_keeps_the_pixels_timm_drops():
    """At 102 x 102 timm's stride-4 patch embedding covers 100 rows and columns: the last two change nothing in
    its output, and change the package's, whose embedding pads them to a 26th patch."""
    from timm.models.twins import Twins
    ref = Twins(**TINY, sr_ratios=(8, 4, 2, 1)).eval()
    ours = PyramidCPVT(**TINY).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(1, 3, 102, 102)
    edited = x.clone()
    edited[..., 100:, :] = torch.randn(1, 3, 2, 102)
    edited[..., :, 100:] = torch.randn(1, 3, 102, 2)
    with torch.no_grad():
        assert torch.equal(ref(x), ref(edited))
        assert rel_l2(ours(edited), ours(x)) > 1e-4


@pytest.mark.parametrize('timm_name, encoding', [('vit_small_patch16_rope_224', 'rope_axial'),
                                                  ('vit_small_patch16_rope_mixed_224', 'rope_mixed')])
def test_cpvt_rope_equals_timm_padding_rope_vits_at_any_size(timm_name, encoding):
    """CPVT with RoPE against timm's RoPE ViTs (depth cut to 2): with ``dynamic_img_pad=True`` timm pads the
    image bottom/right to whole patches as the package does, and the outputs are equal at any size; with
    ``dynamic_img_size`` alone it refuses a side that is not a multiple of 16."""
    ref = timm.create_model(timm_name, dynamic_img_size=True, dynamic_img_pad=True, depth=2).eval()
    with torch.no_grad():  # weights random, layer scales and norm gains 1: the position encodings shape the output
        for n, p in ref.named_parameters():
            unit = 'gamma' in n or ('norm' in n and n.endswith('weight'))
            p.copy_(torch.ones_like(p) if unit else torch.randn_like(p) * (0.5 if 'freqs' in n else 0.05))
    ours = create_model('cpvt_small', pos_encoding=encoding, layer_scale_init=1e-5, depth=2).eval()
    assert not load_into(ours, rope_vit_to_native(ref.state_dict()))
    for h, w in [(100, 90), (33, 47)]:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
    strict = timm.create_model(timm_name, dynamic_img_size=True, depth=2).eval()
    with pytest.raises(AssertionError, match='should be divisible by patch size'):
        strict(torch.randn(1, 3, 100, 96))
