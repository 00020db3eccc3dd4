"""Our models in timm's registry (``cpvt_backbones.adapters.timm``), and timm's feature API on the core models."""
import subprocess
import sys

import pytest
import torch

from cpvt_backbones import create_model
from cpvt_backbones.convert import native_to_mmseg
from cpvt_backbones.models.base import take_indices

timm = pytest.importorskip('timm')
import cpvt_backbones.adapters.timm  # noqa: E402,F401  (registers)

ODD = (2, 3, 53, 75)


@pytest.fixture(scope='module')
def tiny_file(tmp_path_factory):
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp('w') / 'pcpvt_tiny.pth'
    torch.save(create_model('pcpvt_tiny').state_dict(), path)
    return path


def timm_model(name, path, **kwargs):
    return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kwargs).eval()


def test_every_model_is_registered_without_a_fixed_input_size():
    from cpvt_backbones.adapters.timm import TIMM_NAMES
    assert set(TIMM_NAMES.values()) <= set(timm.list_models())
    for name in TIMM_NAMES.values():
        cfg = timm.models.get_pretrained_cfg(name)
        assert cfg.fixed_input_size is False and cfg.classifier == 'head', name
    from cpvt_backbones.convert import WeightsUnavailableError
    with pytest.raises(WeightsUnavailableError, match="no weights are published for 'cpvt_small_gap'"):
        timm.create_model('cpvt_small_gap', pretrained=True)  # (tests/test_hub.py fetches PCPVT weights)


def test_importing_the_adapter_only_adds_our_names():
    code = '''
import timm
before = set(timm.list_models())
import cpvt_backbones, cpvt_backbones.adapters.timm
added = set(timm.list_models()) - before
names = cpvt_backbones.adapters.timm.TIMM_NAMES
assert added == set(names.values()), added
assert set(timm.list_models()) >= before
# timm's own PVTv2 stays timm's; ours is beside it
assert names['pvt_v2_b0'] == 'cpvt_backbones_pvt_v2_b0'
assert type(timm.create_model('pvt_v2_b0')).__module__.startswith('timm.')
assert type(timm.create_model('cpvt_backbones_pvt_v2_b0')).__module__.startswith('cpvt_backbones.')
'''
    subprocess.run([sys.executable, '-c', code], check=True)


def test_classifier_matches_ours_on_the_same_weights(tiny_file):
    ours = create_model('pcpvt_tiny', pretrained=str(tiny_file)).eval()
    theirs = timm_model('pcpvt_tiny', tiny_file)
    x = torch.randn(*ODD)
    with torch.no_grad():
        assert torch.equal(theirs(x), ours(x))
        final, maps = theirs.forward_intermediates(x)
        assert torch.equal(theirs.forward_head(final), ours(x))
    assert [m.shape[1] for m in maps] == [32, 64, 160, 256] and maps[0].shape[-2:] == (14, 19)
    ten = timm_model('pcpvt_tiny', tiny_file, num_classes=10)  # timm drops the mismatched head
    assert ten.head.out_features == 10
    assert torch.equal(ten.blocks[0][0].mlp.fc1.weight, ours.blocks[0][0].mlp.fc1.weight)


@pytest.mark.parametrize('name, out_indices', [('pcpvt_tiny', None), ('pcpvt_tiny', (1, 3)), ('pcpvt_tiny', (0, 1)),
                                               ('cpvt_tiny', (2, -1)), ('cpvt_tiny_gap', None)])
def test_features_only_follows_timm(tmp_path, name, out_indices):
    """features_only is our dense backbone: a pyramid model's stages, a columnar model's simple feature pyramid
    (strides 4-32) on the loaded trunk."""
    torch.manual_seed(1)
    classifier = create_model(name).eval()
    path = tmp_path / 'w.pth'
    torch.save(classifier.state_dict(), path)
    kwargs = {} if out_indices is None else dict(out_indices=out_indices)
    feats = timm_model(name, path, features_only=True, **kwargs)
    levels = take_indices(4, out_indices)[0]
    x = torch.randn(*ODD)
    with torch.no_grad():
        got = feats(x)
    assert isinstance(got, list) and len(got) == len(levels) == len(feats.feature_info.channels())
    assert feats.feature_info.reduction() == [(4, 8, 16, 32)[i] for i in levels]
    dense = create_model(name, features_only=True, out_indices=levels).eval()
    if name.startswith('pcpvt'):
        dense = create_model(name, features_only=True, pretrained=str(path), out_indices=levels).eval()
        with torch.no_grad():
            want = classifier.forward_intermediates(x, indices=out_indices or 4, intermediates_only=True)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=False))
    else:  # the pyramid's layers are new; the trunk is the file's
        trunk = classifier.state_dict()
        assert all(torch.equal(v, trunk[k]) for k, v in feats.model.state_dict().items() if k in trunk)
        dense.load_state_dict(feats.model.state_dict())
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(got, dense(x), strict=False))
    for a, c, s in zip(got, feats.feature_info.channels(), feats.feature_info.reduction(), strict=False):
        assert a.shape[1] == c and a.shape[-2:] == tuple(-(-n // s) for n in ODD[-2:])
    # Built only up to what the outputs need, no head.
    assert not any(k.startswith('head.') for k in feats.state_dict())


def test_mmseg_layout_file_through_timm(tmp_path, tiny_file):
    """timm's pretrained path reads every layout ours does (here mmseg's), dropping what is not built."""
    sd = torch.load(tiny_file)
    path = tmp_path / 'mmseg.pth'
    torch.save({'state_dict': native_to_mmseg(sd), 'meta': {}}, path)
    feats = timm_model('pcpvt_tiny', path, features_only=True)
    assert all(torch.equal(v, sd[f'{k.split(".", 1)[1]}']) for k, v in feats.state_dict().items())


def test_forward_intermediates_and_pruning_on_the_core_models():
    x = torch.randn(*ODD)
    for name in ('pcpvt_tiny', 'cpvt_tiny'):
        model = create_model(name).eval()
        full = set(model.state_dict())
        with torch.no_grad():
            final, maps = model.forward_intermediates(x, indices=(0, -1), norm=True)
            assert torch.equal(model.forward_head(final), model(x)) and len(maps) == 2
            early = model.forward_intermediates(x, indices=(0,), stop_early=True)[1]
            assert torch.allclose(early[0], model.forward_intermediates(x, indices=(0,))[1][0])
        assert model.prune_intermediate_layers((0, 1)) == [0, 1]
        kept = set(model.state_dict())
        # Every key of the full layout is either built or under one of the prefixes the loader drops.
        assert kept < full and all(k.startswith(model.unbuilt_prefixes) for k in full - kept)
        assert model.feature_info[-1]['module'] in ('blocks.1',) and model.num_classes == 0
        with torch.no_grad():
            assert len(model.forward_intermediates(x, indices=2, intermediates_only=True)) == 2
    dense = create_model('pcpvt_tiny', features_only=True)
    with pytest.raises(ValueError, match='features_only model has no final norm'):
        dense.forward_intermediates(x, norm=True)
    with pytest.raises(ValueError, match='prune_intermediate_layers applies to a classifier'):
        dense.prune_intermediate_layers(1)
    with pytest.raises(ValueError, match="output_fmt='NHWC'"):
        dense.forward_intermediates(x, output_fmt='NHWC')


def test_take_indices_follows_timm():
    assert take_indices(4, None) == ([0, 1, 2, 3], 3)
    assert take_indices(4, 2) == ([2, 3], 3)
    assert take_indices(12, (2, -1)) == ([2, 11], 11)
    for bad in (0, 5, (4,), (-5,), ()):
        with pytest.raises(ValueError, match='indices'):
            take_indices(4, bad)
