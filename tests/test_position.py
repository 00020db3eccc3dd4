"""What each position encoding is, and that every one of them runs wherever the models run."""
from pathlib import Path

import pytest
import torch

from cpvt_backbones import create_model, prepare
from cpvt_backbones.compat import supports
from cpvt_backbones.convert import detect_layout, load_into, native_to_rope_vit, rope_vit_to_native
from cpvt_backbones.layers.position import ENCODINGS, Geometry, build_position_encodings, resize_table, rotate
from cpvt_backbones.layers.position.rope import mixed_frequencies, rotary_angles
from cpvt_backbones.layers.position.rpe import relative_index
from cpvt_backbones.layers.position.sincos import sincos_table

ROOT = Path(__file__).resolve().parents[1]
# Every encoding, the PEG's frozen and separable 5 x 5 forms, and the two combinations with a PEG; 'peg' alone
# takes its default placement (the first block of every stage).
SPECS = ['none', 'peg', dict(type='peg', frozen=True), dict(type='peg', positions=None, kernel_size=5,
                                                             peg_type='separable'),
         'peg_qk', 'conv1x1', 'learned', 'sincos', 'rpe', 'rope_axial', 'rope_mixed', 'learned+peg', 'rope_mixed+peg']
IDS = ['none', 'peg', 'peg_frozen', 'peg_separable', 'peg_qk', 'conv1x1', 'learned', 'sincos', 'rpe', 'rope_axial',
       'rope_mixed', 'learned+peg', 'rope_mixed+peg']
SMALL = {'pcpvt_tiny': dict(depths=(2, 1, 1, 1)), 'cpvt_tiny': dict(depth=3)}


def small(name, spec, **kwargs):
    torch.manual_seed(0)
    return create_model(name, pos_encoding=spec, **SMALL[name], **kwargs)


def test_every_registered_encoding_is_covered():
    named = {s if isinstance(s, str) else s['type'] for s in SPECS for s in ([s] if isinstance(s, dict) else
                                                                             s.split('+'))}
    assert set(ENCODINGS) | {'none'} == named


@pytest.mark.parametrize('spec', SPECS, ids=IDS)
@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_any_size_classifier_backbone_and_intermediates(name, spec):
    clf = small(name, spec, num_classes=7).eval()
    dense = small(name, spec, features_only=True).eval()
    with torch.no_grad():
        for h, w in ((1, 1), (7, 500), (97, 131)):
            x = torch.randn(2, 3, h, w)
            logits = clf(x)
            assert logits.shape == (2, 7) and torch.isfinite(logits).all()
            maps = dense(x)
            assert [tuple(m.shape[1:]) for m in maps] == [(c, -(-h // s), -(-w // s))
                                                          for c, s in zip(dense.out_channels, dense.strides,
                                                                          strict=True)]
            final, inter = clf.forward_intermediates(x, indices=2)
            assert len(inter) == 2 and torch.isfinite(final).all()
            torch.testing.assert_close(clf.forward_head(final), logits)


@pytest.mark.parametrize('spec', SPECS, ids=IDS)
@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_the_fused_engine_keeps_every_encoding(name, spec):
    """The fused path starts after attention, so every encoding (tokens, attention, after a block) is kept."""
    plain = small(name, spec, features_only=True).eval()
    fast = prepare(plain, 'fused')
    x = torch.randn(2, 3, 97, 131)
    with torch.no_grad():
        for a, b in zip(plain(x), fast(x), strict=False):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert fast.state_dict().keys() == plain.state_dict().keys()


def test_the_fused_engine_names_what_it_cannot_fuse():
    with pytest.raises(ValueError, match=r'blocks\.0\.ls1 is a LayerScale \(layer_scale_init\)'):
        prepare(create_model('cpvt_tiny', pos_encoding='rope_mixed', layer_scale_init=1e-5, depth=2).eval(), 'fused')


@pytest.mark.heavy
@pytest.mark.parametrize('name, spec', [('pcpvt_tiny', 'rpe+rope_mixed'), ('pcpvt_tiny', 'learned'),
                                        ('cpvt_tiny', 'sincos+peg_qk'), ('cpvt_tiny', 'learned+peg')])
def test_onnx_dynamic_size(name, spec, tmp_path):
    """One exported graph with dynamic batch, height and width agrees with PyTorch at three sizes. The pyramid
    covers the encodings that look at reduced keys (RPE's bias with RoPE's rotation, in one model: an export costs
    tens of seconds) or resize per stage (the table), the columnar model those that skip a class token; the
    PEG-only models are covered by test_deploy.py."""
    pytest.importorskip('onnxruntime')
    if supports('export'):
        pytest.importorskip('onnxscript')  # the dynamo exporter's
    from cpvt_backbones.deploy.onnx import export, verify
    # two stages for the pyramid (reduced keys in the first, all tokens in the second): export time is tracing time
    shallow = dict(depths=(1, 1), embed_dims=(32, 64), num_heads=(1, 2), mlp_ratios=(2, 2), sr_ratios=(2, 1),
                   patch_sizes=(4, 2)) if name == 'pcpvt_tiny' else dict(depth=2)
    torch.manual_seed(0)
    model = create_model(name, features_only=True, pos_encoding=spec, **shallow).eval()
    path = str(tmp_path / 'model.onnx')
    if 'learned' in spec and not supports('export'):  # the table's antialiased resize: no TorchScript symbolic
        with pytest.raises(RuntimeError, match=r'exporting this model to ONNX needs torch >= 2\.6'):
            export(model, path, [f'stride{s}' for s in model.strides])
        return
    export(model, path, [f'stride{s}' for s in model.strides])
    assert verify(model, path, [(64, 96), (97, 131), (224, 160)], batch=1) < 1e-3


def _logits(q: torch.Tensor, k: torch.Tensor, q_angles: torch.Tensor, k_angles: torch.Tensor) -> torch.Tensor:
    """(heads, N, M) logits of one query vector and one key vector per head, placed at every position."""
    n, m = q_angles.shape[-2], k_angles.shape[-2]
    qs = rotate(q[None, :, None].expand(1, -1, n, -1), q_angles)
    ks = rotate(k[None, :, None].expand(1, -1, m, -1), k_angles)
    return (qs @ ks.transpose(-1, -2))[0]


@pytest.mark.parametrize('learned', [False, True])
def test_rope_logits_depend_only_on_the_offset(learned):
    """Shift a query and a key by the same (dy, dx): the logit is unchanged (RoPE's defining property), for
    axial and for learned (here random, rotated) mixed frequencies."""
    torch.manual_seed(0)
    heads, head_dim, hw = 3, 16, (6, 7)
    freqs = mixed_frequencies(head_dim, heads, 10., torch.rand(heads) * 6.28 if learned else None)
    if learned:
        freqs = freqs + 0.3 * torch.randn_like(freqs)
    angles = rotary_angles(freqs, hw)
    q, k = torch.randn(heads, head_dim), torch.randn(heads, head_dim)
    logits = _logits(q, k, angles, angles).reshape(heads, *hw, *hw)
    dy, dx = 2, 3
    torch.testing.assert_close(logits[:, dy:, dx:, dy:, dx:], logits[:, :-dy, :-dx, :-dy, :-dx], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(logits[:, 0, 0, 0, 0], logits[:, 0, 0, 2, 3], atol=1e-3)  # it does see the offset


def test_rope_keys_of_a_reduced_map_sit_at_their_cell_centres():
    """With keys reduced 2x, shifting queries by 2 tokens and keys by one reduced cell keeps the logits."""
    torch.manual_seed(0)
    freqs = mixed_frequencies(8, 2, 10., torch.rand(2) * 6.28)
    q_angles, k_angles = rotary_angles(freqs, (8, 8)), rotary_angles(freqs, (4, 4), step=2)
    logits = _logits(torch.randn(2, 8), torch.randn(2, 8), q_angles, k_angles).reshape(2, 8, 8, 4, 4)
    torch.testing.assert_close(logits[:, 2:, 2:, 1:, 1:], logits[:, :-2, :-2, :-1, :-1], atol=1e-4, rtol=1e-4)


def test_rope_leaves_the_class_token_and_keeps_norms():
    x = torch.randn(2, 3, 1 + 12, 8)
    angles = torch.rand(3, 12, 4) * 6
    y = rotate(x, angles)
    assert torch.equal(y[:, :, 0], x[:, :, 0])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize('grid', [(7, 7), (4, 9)])
def test_learned_table_resized_to_its_own_grid_is_the_identity(grid):
    table = torch.randn(1, grid[0] * grid[1], 12)
    torch.testing.assert_close(resize_table(table, grid, grid), table, atol=1e-6, rtol=0)
    assert resize_table(table, grid, (5, 11)).shape == (1, 55, 12)


def test_learned_table_per_stage_and_class_token_entry():
    pyr = create_model('pcpvt_tiny', pos_encoding=dict(type='learned', img_size=(64, 96)))
    assert [tuple(pyr.pos_embed.table(i).shape) for i in range(4)] == [(1, 16 * 24, 32), (1, 8 * 12, 64),
                                                                      (1, 4 * 6, 160), (1, 2 * 3, 256)]
    col = create_model('cpvt_tiny', pos_encoding='learned')
    assert col.pos_embed.table(0).shape == (1, 1 + 14 * 14, 192)


def test_sincos_has_no_parameters_and_extends_to_any_grid():
    model = create_model('cpvt_tiny', pos_encoding='sincos')
    assert list(model.pos_sincos.parameters()) == [] and not any('sincos' in k for k in model.state_dict())
    small_grid, big_grid = sincos_table((3, 4), 16), sincos_table((6, 8), 16)
    torch.testing.assert_close(big_grid.reshape(6, 8, 16)[:3, :4].reshape(12, 16), small_grid)
    # token (row 1, column 2): sin/cos of column 2 then of row 1 at frequencies 1 / 10000 ** (i / 4)
    freqs = 10000. ** (-torch.arange(4) / 4)
    expected = torch.cat(((2 * freqs).sin(), (2 * freqs).cos(), freqs.sin(), freqs.cos()))
    torch.testing.assert_close(small_grid[1 * 4 + 2], expected)


def test_frozen_peg_gets_no_gradient():
    model = create_model('pcpvt_tiny', pos_encoding=dict(type='peg', frozen=True))
    before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith('pos_block.')}
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    pegs = [p for n, p in model.named_parameters() if n.startswith('pos_block.')]
    assert pegs and all(not p.requires_grad and p.grad is None for p in pegs)
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.startswith('pos_block.'))
    assert any(v.abs().sum() > 0 for k, v in before.items() if k.endswith('weight'))  # random, not zero


def test_conv1x1_sees_no_position():
    """Twelve residual 1 x 1 convolutions act per token: a GAP model with them, like one without any encoding,
    gives the same output when the patches are shuffled (with a 3 x 3 PEG it does not)."""
    x = torch.randn(1, 3, 64, 64)
    perm = torch.randperm(16)
    shuffled = x.unfold(2, 16, 16).unfold(3, 16, 16).reshape(1, 3, 16, 16, 16)[:, :, perm]
    shuffled = shuffled.reshape(1, 3, 4, 4, 16, 16).permute(0, 1, 2, 4, 3, 5).reshape(1, 3, 64, 64)
    for spec, invariant in (('conv1x1', True), ('peg', False)):
        model = create_model('cpvt_tiny_gap', pos_encoding=spec, depth=3).eval()
        if spec == 'conv1x1':
            assert len(model.pos_block) == 3 and model.pos_block[0].proj[0].kernel_size == (1, 1)
        with torch.no_grad():
            assert torch.allclose(model(x), model(shuffled), atol=1e-5) is invariant


def test_peg_qk_feeds_queries_and_keys_only():
    """In its block, the query projection and one key/value projection see x + conv(x), values see x; with a
    zero convolution the model equals one without position encoding."""
    model = create_model('cpvt_tiny', pos_encoding='peg_qk', depth=3).eval()
    assert model.pos_qk.places == [(0, 1)]
    seen = {'kv': []}
    attn = model.blocks[1].attn
    hooks = [attn.q.register_forward_pre_hook(lambda m, args: seen.update(q=args[0])),
             attn.kv.register_forward_pre_hook(lambda m, args: seen['kv'].append(args[0])),
             model.blocks[1].norm1.register_forward_hook(lambda m, args, out: seen.update(x=out))]
    with torch.no_grad():
        model(torch.randn(1, 3, 48, 64))
    for hook in hooks:
        hook.remove()
    x, (for_values, for_keys) = seen['x'], seen['kv']
    assert torch.equal(for_values, x) and torch.equal(for_keys, seen['q']) and not torch.allclose(seen['q'], x)
    none = create_model('cpvt_tiny', pos_encoding='none', depth=3).eval()
    none.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith('pos_qk.')})
    with torch.no_grad():
        for p in model.pos_qk.parameters():
            p.zero_()
        image = torch.randn(2, 3, 48, 64)
        torch.testing.assert_close(model(image), none(image))


def test_relative_bias_index_is_the_clipped_offset():
    k = 2
    index = relative_index((5, 6), (5, 6), 1, k).reshape(5, 6, 5, 6)
    torch.testing.assert_close(index[1:, 1:, 1:, 1:], index[:-1, :-1, :-1, :-1])   # shift-invariant
    size = 2 * k + 1
    assert index[4, 5, 0, 0] == (2 * k) * size + 2 * k                            # (+4, +5) clipped to (+2, +2)
    assert index[0, 0, 4, 5] == 0 and index[2, 3, 2, 3] == k * size + k
    reduced = relative_index((4, 4), (2, 2), 2, k).reshape(4, 4, 2, 2)
    assert reduced[3, 3, 1, 1] == k * size + k   # query row 3 sits in key row 1 when keys are reduced 2x


def test_rpe_bias_reaches_the_logits_per_block_and_head():
    model = create_model('pcpvt_tiny', pos_encoding=dict(type='rpe', max_distance=3))
    assert model.rel_pos.num_tables == 8 and tuple(getattr(model.rel_pos, '3').shape) == (2, 49)
    model(torch.randn(1, 3, 64, 64)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.rel_pos.parameters())


@pytest.mark.parametrize('spec, prefixes', [('rope_mixed', ('rope.freqs.',)), ('rpe', ('rel_pos.',)),
                                            ('learned', ('pos_embed.',)), ('peg_qk', ('pos_qk.',))])
def test_dense_backbone_drops_exactly_the_unbuilt_parts(spec, prefixes):
    """A features-only pyramid up to stage 1 builds no encoding part of stages 2-3; the full classifier's
    weights load into it strictly once those (listed in ``unbuilt_prefixes``) are dropped."""
    full = create_model('pcpvt_tiny', pos_encoding=spec)
    dense = create_model('pcpvt_tiny', pos_encoding=spec, features_only=True, out_indices=(0, 1))
    extra = set(full.state_dict()) - set(dense.state_dict())
    assert extra and all(k.startswith(dense.unbuilt_prefixes) for k in extra)
    assert not any(k.startswith(dense.unbuilt_prefixes) for k in dense.state_dict())
    assert any(k.startswith(prefixes) for k in extra)
    load_into(dense, full.state_dict())
    clf = create_model('cpvt_tiny', pos_encoding=spec)
    clf.prune_intermediate_layers(indices=(1,))
    assert set(create_model('cpvt_tiny', pos_encoding=spec).state_dict()) - set(clf.state_dict()) <= {
        k for k in create_model('cpvt_tiny', pos_encoding=spec).state_dict() if k.startswith(clf.unbuilt_prefixes)}


def test_freezing_blocks_freezes_their_encoding_parts():
    col = create_model('cpvt_tiny', pos_encoding='rope_mixed', frozen_stages=2)
    frozen = {n for n, p in col.named_parameters() if n.startswith('rope.') and not p.requires_grad}
    assert frozen == {'rope.freqs.0', 'rope.freqs.1'}
    pyr = create_model('pcpvt_tiny', pos_encoding=['learned', 'rpe'], frozen_stages=1)
    frozen = {n for n, p in pyr.named_parameters() if not p.requires_grad and not n.startswith(('blocks.', 'patch'))}
    assert frozen == {'pos_embed.0', 'rel_pos.0', 'rel_pos.1'}
    stem_only = create_model('cpvt_tiny', pos_encoding='learned', frozen_stages=0)
    assert not stem_only.pos_embed.table(0).requires_grad


def test_encoding_parameters_get_no_weight_decay():
    model = create_model('pcpvt_tiny', pos_encoding=['rope_mixed', 'learned', 'peg'])
    names = {n for n, _ in model.named_parameters() if n.startswith(('rope.', 'pos_embed.', 'pos_block.'))}
    assert names and names <= model.no_weight_decay()


@pytest.mark.parametrize('spec, error, match', [
    ('bogus', ValueError, r"unknown position encoding 'bogus'; valid names: \['conv1x1', 'learned'"),
    (dict(type='peg', kernal_size=3), TypeError, r"'peg' has no option\(s\) \['kernal_size'\]; valid options"),
    ('peg+conv1x1', ValueError, "'peg' and 'conv1x1' cannot be combined: both are pos_block"),
    ('rope_axial+rope_mixed', ValueError, 'cannot be combined'),
    (dict(type='none', positions=(0,)), ValueError, "'none' takes no options"),
    (dict(type='peg', positions=(12,)), ValueError, r'within -1..11'),
    (dict(type='rpe', max_distance=0), ValueError, 'max_distance must be an int >= 1'),
    (dict(type='learned', interpolation='nearest'), ValueError, 'interpolation must be one of'),
    (42, TypeError, 'pos_encoding must be a name'),
])
def test_bad_encodings_are_named(spec, error, match):
    with pytest.raises(error, match=match):
        create_model('cpvt_tiny', pos_encoding=spec)


def test_width_constraints_are_named():
    with pytest.raises(ValueError, match='sincos needs widths that are multiples of 4'):
        create_model('cpvt_tiny', embed_dim=66, num_heads=3, pos_encoding='sincos')
    with pytest.raises(ValueError, match=r'rope_mixed needs head widths that are multiples of 4, got \[6\]'):
        create_model('cpvt_tiny', embed_dim=18, num_heads=3, pos_encoding='rope_mixed')
    with pytest.raises(ValueError, match="'learned' and 'learned' cannot be combined"):
        build_position_encodings(['learned', dict(type='learned')], Geometry((8,), (1,), (1,), (4,), (1,)))


# timm's RoPE ViTs and the settings of ours that reproduce them (depth cut to 3 for speed).
ROPE_VITS = [('vit_small_patch16_rope_mixed_224', 'rope_mixed'), ('vit_small_patch16_rope_224', 'rope_axial')]


@pytest.mark.parametrize('timm_name, spec', ROPE_VITS)
def test_rope_matches_timm_on_the_same_weights(timm_name, spec):
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    ref = timm.create_model(timm_name, dynamic_img_size=True, depth=3).eval()
    with torch.no_grad():  # weights random, layer scales and norm gains 1: position encodings shape the output
        for n, p in ref.named_parameters():
            unit = 'gamma' in n or ('norm' in n and n.endswith('weight'))
            p.copy_(torch.ones_like(p) if unit else torch.randn_like(p) * (0.5 if 'freqs' in n else 0.05))
    sd = ref.state_dict()
    assert detect_layout(sd) == 'rope_vit'
    ours = create_model('cpvt_small', pos_encoding=spec, layer_scale_init=1e-5, depth=3).eval()
    load_into(ours, rope_vit_to_native(sd))
    blind = create_model('cpvt_small', pos_encoding='none', layer_scale_init=1e-5, depth=3).eval()
    load_into(blind, {k: v for k, v in rope_vit_to_native(sd).items() if not k.startswith('rope.')})
    with torch.no_grad():
        for hw in ((224, 224), (96, 160), (16, 48)):
            x = torch.randn(2, 3, *hw)
            expected = ref(x)
            torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=1e-5)
            assert (blind(x) - expected).abs().max() > 0.1   # RoPE matters with these weights
    back = native_to_rope_vit(ours.state_dict())
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_rope_vit_writer_refuses_other_encodings():
    from cpvt_backbones.convert import UnknownKeysError
    with pytest.raises(UnknownKeysError, match=r'pos_block\.0\.proj\.0\.bias'):
        native_to_rope_vit(create_model('cpvt_tiny', pos_encoding='rope_mixed+peg', depth=2).state_dict())


def test_selectable_from_openmmlab_configs_and_timm():
    pytest.importorskip('mmdet')
    timm = pytest.importorskip('timm')
    from mmdet.registry import MODELS

    import cpvt_backbones.adapters.mmdet  # noqa: F401
    import cpvt_backbones.adapters.timm  # noqa: F401
    backbone = MODELS.build(dict(type='PyramidCPVT', arch=dict(base='pcpvt_tiny', pos_encoding='rope_mixed+peg')))
    assert backbone.pos_encoding_attrs == ('rope', 'pos_block')
    assert [o.shape[1] for o in backbone(torch.randn(1, 3, 45, 61))] == [32, 64, 160, 256]
    model = timm.create_model('cpvt_tiny_gap', pos_encoding=dict(type='rpe', max_distance=4), depth=2)
    assert model.pos_encoding_attrs == ('rel_pos',) and getattr(model.rel_pos, '1').shape == (3, 81)


@pytest.mark.parametrize('encoding, name, low', [('peg', 'peg kernel_size', 3), ('peg_qk', 'peg_qk kernel_size', 3)])
@pytest.mark.parametrize('kernel', [4, 1, 0, True, 3.0])
def test_kernel_sizes_are_checked_in_one_place(encoding, name, low, kernel):
    from cpvt_backbones.layers.position.peg import PEG
    with pytest.raises(ValueError, match=f'{name} must be odd and >= {low} .*got {kernel!r}'):
        create_model('pcpvt_tiny', pos_encoding=dict(type=encoding, kernel_size=kernel))
    if kernel != 1:
        with pytest.raises(ValueError, match=f'^kernel_size must be odd and >= 1 .*got {kernel!r}'):
            PEG(8, kernel)


def test_encodings_say_what_they_are_in_the_models_repr():
    shown = {'peg': 'peg after 0;0;0;0', 'peg_qk': 'peg_qk in 1;1;1;1', 'rpe': 'rpe (K=', 'learned': 'learned (',
             'rope_mixed': 'rope_mixed (temperature'}
    for encoding, text in shown.items():
        assert text in repr(create_model('pcpvt_tiny', pos_encoding=encoding)), encoding
