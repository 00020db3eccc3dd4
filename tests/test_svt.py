"""Twins-SVT: windowed attention against a hand-computed reference, the model's contract at odd sizes, timm's
outputs on the same weights, and its weights in every layout."""
import math

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cpvt_backbones import PyramidCPVT, TwinsSVT, create_model
from cpvt_backbones.convert import (
    UnknownKeysError,
    detect_layout,
    hub,
    load_into,
    mmpretrain_to_native,
    mmseg_to_native,
    native_to_mmpretrain,
    native_to_mmseg,
    to_native,
)
from cpvt_backbones.layers import Attention, Block, LocallyGroupedAttention
from cpvt_backbones.layers.position import ENCODINGS

# A CPU-sized SVT: every part of svt_small (two blocks per stage: one windowed, one global), narrower.
TINY = dict(embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))
ODD_SIZES = [(1, 1), (7, 45), (33, 33), (97, 131)]


def tiny(**kwargs) -> TwinsSVT:
    torch.manual_seed(0)
    return create_model('svt_small', **{**TINY, **kwargs})


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


# ------------------------------------------------------------------------------------------- windowed attention

def windows_by_hand(attn: LocallyGroupedAttention, x: torch.Tensor, hw, masked: bool) -> torch.Tensor:
    """The layer's output computed one window at a time: zero-pad the map to whole windows, attend within each
    window (without the padded keys when ``masked``), drop the padding, project."""
    B, N, C = x.shape
    ws, heads = attn.window_size, attn.num_heads
    H, W = hw
    Hp, Wp = math.ceil(H / ws) * ws, math.ceil(W / ws) * ws
    grid = torch.zeros(B, Hp, Wp, C)
    grid[:, :H, :W] = x.reshape(B, H, W, C)
    real = torch.zeros(Hp, Wp, dtype=torch.bool)
    real[:H, :W] = True
    out = torch.zeros(B, Hp, Wp, C)
    for r in range(0, Hp, ws):
        for c in range(0, Wp, ws):
            tokens = grid[:, r:r + ws, c:c + ws].reshape(B, ws * ws, C)
            q, k, v = attn.qkv(tokens).reshape(B, ws * ws, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
            logits = q @ k.transpose(-1, -2) / math.sqrt(C // heads)
            if masked:
                keep = real[r:r + ws, c:c + ws].reshape(-1)
                logits = logits.masked_fill(~keep, float('-inf'))
            mixed = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, ws, ws, C)
            out[:, r:r + ws, c:c + ws] = mixed
    return attn.proj(out[:, :H, :W].reshape(B, N, C))


@pytest.mark.parametrize('masked', [False, True])
@pytest.mark.parametrize('hw, ws', [((9, 12), 4), ((7, 7), 7), ((1, 1), 7), ((3, 15), 7), ((10, 5), 3)])
def test_windowed_attention_equals_a_loop_over_windows(masked, hw, ws):
    torch.manual_seed(0)
    attn = LocallyGroupedAttention(24, 3, window_size=ws, window_mask=masked).eval()
    with torch.no_grad():
        attn.qkv.bias.normal_()  # padded tokens are the bias: make it matter
        x = torch.randn(2, hw[0] * hw[1], 24)
        torch.testing.assert_close(attn(x, hw), windows_by_hand(attn, x, hw, masked), rtol=0, atol=1e-5)


def test_the_mask_matters_only_where_windows_are_padded():
    torch.manual_seed(0)
    attn = LocallyGroupedAttention(24, 3, window_size=4)
    masked = LocallyGroupedAttention(24, 3, window_size=4, window_mask=True)
    masked.load_state_dict(attn.state_dict())
    with torch.no_grad():
        attn.qkv.bias.normal_()
        masked.qkv.bias.copy_(attn.qkv.bias)
        whole, padded = torch.randn(1, 8 * 12, 24), torch.randn(1, 9 * 12, 24)
        assert torch.equal(attn(whole, (8, 12)), masked(whole, (8, 12)))
        assert rel_l2(attn(padded, (9, 12)), masked(padded, (9, 12))) > 1e-3


def test_windowed_attention_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match='sr_ratio must be 1'):
        LocallyGroupedAttention(32, 2, sr_ratio=2)
    with pytest.raises(ValueError, match='window_size'):
        LocallyGroupedAttention(32, 2, window_size=0)
    with pytest.raises(ValueError, match='rpe.*cannot take it'):
        tiny(pos_encoding='rpe')
    with pytest.raises(ValueError, match='TwinsSVT needs window_sizes'):
        tiny(window_sizes=None)
    for windowed in (dict(window_mask=True), dict(window_sizes=(7, 7, 7, 7))):   # windows are TwinsSVT's alone
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(windowed))}'"):
            PyramidCPVT(depths=(1, 1, 1, 1), **windowed)
    with pytest.raises(ValueError, match='one entry per stage'):
        tiny(window_sizes=(7, 7))


# -------------------------------------------------------------------------------------------------- the model

@pytest.mark.parametrize('name, expected', [('svt_small', 24_060_776), ('svt_base', 56_070_952),
                                            ('svt_large', 99_271_400)])
def test_parameter_counts_equal_timm(name, expected):
    with torch.device('meta'):
        model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_blocks_alternate_windowed_and_global_attention():
    model = create_model('svt_small')
    for i, stage in enumerate(model.blocks):
        kinds = [type(b.attn) for b in stage]
        assert kinds == [LocallyGroupedAttention, Attention] * (len(stage) // 2)
        assert all(b.attn.window_size == 7 for b in stage[::2])
        assert [b.attn.sr_ratio for b in stage[1::2]] == [(8, 4, 2, 1)[i]] * (len(stage) // 2)
    keys = model.state_dict()
    assert 'blocks.0.0.attn.qkv.weight' in keys and 'blocks.0.1.attn.kv.weight' in keys
    assert 'blocks.0.1.attn.sr.weight' in keys and 'blocks.3.1.attn.sr.weight' not in keys
    assert len(model.pos_block) == 4 and model.pos_block.peg_after == {(i, 0): i for i in range(4)}


@pytest.mark.parametrize('window_mask', [False, True])
def test_features_and_classifier_at_any_size(window_mask):
    dense = tiny(features_only=True, window_mask=window_mask).eval()
    classifier = tiny(num_classes=5, window_mask=window_mask).eval()
    for h, w in ODD_SIZES:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            maps, logits = dense(x), classifier(x)
        assert [tuple(m.shape) for m in maps] == [(2, c, math.ceil(h / s), math.ceil(w / s))
                                                  for c, s in zip((16, 32, 64, 128), (4, 8, 16, 32), strict=True)]
        assert logits.shape == (2, 5) and all(torch.isfinite(m).all() for m in (*maps, logits))


@pytest.mark.parametrize('features_only', [False, True])
def test_gradients_reach_every_parameter_under_drop_path(features_only):
    model = tiny(features_only=features_only, drop_path_rate=0.1, window_mask=features_only).train()
    out = model(torch.randn(8, 3, 70, 45))
    sum(o.pow(2).mean() for o in (out if features_only else (out,))).backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]


def test_out_indices_frozen_stages_and_checkpointing():
    model = tiny(features_only=True, out_indices=(1, 2), frozen_stages=1)
    assert len(model.blocks) == 3 and model.out_channels == (32, 64)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(('patch_embeds.0.', 'blocks.0.', 'pos_block.0.')) for n in frozen)
    x = torch.randn(2, 3, 50, 61)
    plain, checkpointed = tiny(drop_path_rate=0.), tiny(grad_checkpointing=True)
    plain(x).sum().backward()
    checkpointed(x).sum().backward()
    for (n, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_forward_intermediates_are_the_dense_maps():
    model, dense = tiny().eval(), tiny(features_only=True).eval()
    dense.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith(('norm.', 'head.'))})
    x = torch.randn(1, 3, 45, 77)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        for a, b in zip(maps, dense(x), strict=True):
            assert torch.equal(a, b)
        torch.testing.assert_close(final, model.forward_features(x))


@pytest.mark.parametrize('encoding', sorted(set(ENCODINGS) - {'rpe'}) + [dict(type='peg_qk', positions=((0,),) * 4)])
def test_position_encodings_that_apply_and_trace(encoding):
    """Every encoding but ``rpe`` (refused above) runs, and torch.fx traces it (windowed blocks included: a PEG on
    their queries and keys at block 0) to the same values."""
    from cpvt_backbones.compat import supports
    model = tiny(pos_encoding=encoding, window_mask=True).eval()
    sized = encoding in ('sincos', 'rope_axial', 'rope_mixed')
    graph = torch.fx.symbolic_trace(model) if supports('fx_sizes') or not sized else model
    for hw in [(33, 47), (64, 64)]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            out = model(x)
            assert torch.isfinite(out).all() and torch.equal(graph(x), out)


def test_int8_dynamic_quantisation():
    """Dynamic int8 quantisation replaces every linear layer (windowed ``qkv`` included) and stays close:
    relative L2 0.02 measured on this random model; a broken path gives errors of order 1."""
    import copy
    import warnings
    model = tiny().eval()
    with warnings.catch_warnings():  # torch.ao's eager quantisation is deprecated in favour of torchao
        warnings.simplefilter('ignore')
        quantised = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    assert not any(type(m) is nn.Linear for m in quantised.modules())
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        assert rel_l2(quantised(x), model(x)) < 0.15


def test_rope_turns_windowed_keys_by_their_own_angles():
    """With RoPE, a windowed block's logits depend on the offset of query and key only (keys turn by the angles of
    their own tokens): turning every token as if the map moved leaves the output unchanged."""
    torch.manual_seed(0)
    model = tiny(pos_encoding='rope_axial')
    attn, rope = model.blocks[0][0].attn, model.rope
    x = torch.randn(1, 4 * 14, 16)
    with torch.no_grad():
        pos = rope.attention(0, (4, 14))[0]
        turned = pos.rotary.query + 5 * rope.frequencies(0, 0)[0][:, None, :]  # every token 5 columns right
        shifted = pos._replace(rotary=pos.rotary._replace(query=turned))
        assert not torch.equal(turned, pos.rotary.query)
        torch.testing.assert_close(attn(x, (4, 14), pos), attn(x, (4, 14), shifted), rtol=0, atol=1e-5)


@pytest.mark.parametrize('window_mask', [False, True])
def test_plain_module_contract_hooks_fx_and_flops(window_mask):
    model = tiny(features_only=True, window_mask=window_mask).eval()
    calls = []
    for b in (m for m in model.modules() if isinstance(m, Block)):
        b.attn.proj.register_forward_hook(lambda *_: calls.append(1))
    graph = torch.fx.symbolic_trace(model)
    for hw in [(33, 47), (56, 56)]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            for a, b in zip(model(x), graph(x), strict=True):
                # the traced graph keeps the (all-valid) window mask where eager skips it at whole windows; torch
                # 2.1 then picks another attention kernel (differences of 1e-6), newer torch gives the same bits
                torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    assert len(calls) == 2 * 2 * 8  # every block's projection, eager and traced, at both sizes
    expected = []
    for layer in (m for m in model.modules() if isinstance(m, nn.Linear)):
        layer.register_forward_hook(lambda m, inp, out: expected.append(2 * inp[0].numel() * m.out_features))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(2, 3, 64, 96))
    counts = {str(op): n for op, n in counter.get_flop_counts()['Global'].items()}
    assert counts.get('aten.addmm', 0) + counts.get('aten.mm', 0) == sum(expected) > 0


# ------------------------------------------------------------------------------------------------------ timm

@pytest.mark.parametrize('name', [pytest.param('svt_small', id='small'),
                                  pytest.param('svt_base', id='base', marks=pytest.mark.heavy)])  # L: B's code
def test_outputs_equal_timm(name):
    """timm lets padded tokens take part in window attention: ours with the default ``window_mask=False``."""
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    ref = timm.create_model(f'twins_{name}').eval()
    ours = create_model(name).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    dense = create_model(name, features_only=True).eval()
    assert not load_into(dense, ref.state_dict())
    for h, w in [(224, 224), (96, 128)]:  # windows whole, and padded in the first three stages
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            assert rel_l2(ours(x), ref(x)) < 1e-4, (h, w)
            for a, b in zip(dense(x), ref.forward_intermediates(x, intermediates_only=True), strict=True):
                assert rel_l2(a, b) < 1e-4, (h, w)


# --------------------------------------------------------------------------------------------------- weights

@pytest.fixture(scope='module')
def svt_sd():
    return tiny().state_dict()


def test_mmseg_and_mmpretrain_round_trips(svt_sd):
    mm = native_to_mmseg(svt_sd)
    assert detect_layout(mm) == 'mmseg'
    assert {'layers.0.0.attn.qkv.weight', 'layers.0.0.attn.proj.weight', 'layers.0.1.attn.attn.in_proj_weight',
            'layers.0.1.attn.attn.out_proj.weight', 'layers.0.1.attn.sr.weight'} <= set(mm)
    assert 'layers.0.0.attn.attn.out_proj.weight' not in mm and not any(k.startswith(('head.', 'norm.')) for k in mm)
    back = mmseg_to_native(mm)
    assert set(back) == {k for k in svt_sd if not k.startswith(('head.', 'norm.'))}
    assert all(torch.equal(back[k], svt_sd[k]) for k in back)
    pre = native_to_mmpretrain(svt_sd)
    assert detect_layout(pre) == 'mmpretrain' and 'backbone.stages.2.0.attn.qkv.weight' in pre
    back = mmpretrain_to_native(pre)
    assert set(back) == set(svt_sd) and all(torch.equal(back[k], svt_sd[k]) for k in back)
    assert detect_layout(svt_sd) == 'native' and to_native(svt_sd).keys() == svt_sd.keys()
    for layout in (mm, pre):
        model = tiny(features_only=True)
        assert not load_into(model, layout)
        assert all(torch.equal(v, svt_sd[k]) for k, v in model.state_dict().items())


def test_converters_raise_on_unknown_and_leftover_keys(svt_sd):
    mm = native_to_mmseg(svt_sd)
    with pytest.raises(UnknownKeysError, match='layers.0.0.attn.extra.weight'):
        mmseg_to_native({**mm, 'layers.0.0.attn.extra.weight': torch.zeros(1)})
    with pytest.raises(UnknownKeysError, match='norm_list.0.weight'):
        mmseg_to_native({**mm, 'norm_list.0.weight': torch.zeros(1)})
    lone_q = {k: v for k, v in svt_sd.items() if k != 'blocks.1.1.attn.kv.weight'}
    with pytest.raises(UnknownKeysError, match='blocks.1.1.attn.q.weight'):
        native_to_mmseg(lone_q)
    both = {**svt_sd, 'blocks.1.1.attn.qkv.weight': torch.zeros(1)}
    for convert in (native_to_mmseg, native_to_mmpretrain):
        with pytest.raises(UnknownKeysError, match='blocks.1.1.attn.qkv.weight'):
            convert(both)
    with pytest.raises(UnknownKeysError, match='backbone.stages.0.0.attn.extra.bias'):
        mmpretrain_to_native({**native_to_mmpretrain(svt_sd), 'backbone.stages.0.0.attn.extra.bias': torch.zeros(1)})


def test_published_weights_are_listed_by_name():
    for size, timm_hash, mmseg_hash in [('small', '42e5f78c', '7e1c3695'), ('base', 'c2265010', '1b7eb711'),
                                        ('large', '90f6aaa9', 'fb5936f3')]:
        table = hub.PRETRAINED[f'svt_{size}']
        assert [s.layout for s in table] == ['native', 'native', 'mmseg']
        assert table[0].url.endswith(f'timm/twins_svt_{size}.in1k/resolve/main/model.safetensors')
        assert (table[1].sha256_prefix, table[2].sha256_prefix) == (timm_hash, mmseg_hash)
        assert f'alt_gvt_{size}_' in table[2].url and not table[2].classifier


def test_pretrained_by_name_goes_through_the_checked_cache(tmp_path, monkeypatch):
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(tmp_path))

    def offline(source, path):
        raise OSError('network is unreachable')
    monkeypatch.setattr(hub, '_fetch', offline)
    with pytest.raises(hub.WeightsUnavailableError) as info:
        create_model('svt_small', pretrained=True, depths=(2, 2, 2, 2))
    assert 'twins_svt_small.in1k' in str(info.value) and 'twins_svt_small-42e5f78c.pth' in str(info.value)


# ------------------------------------------------------------------------------------------ other frameworks

def test_features_equal_mmseg_svt():
    """mmseg's ``SVT`` on our weights: equal maps where no window is padded (224) whatever the mask, and with
    ``window_mask=True`` where both sides of every stage's map are padded (96 x 128), where its mask applies."""
    pytest.importorskip('mmseg')
    from mmseg.models.backbones import SVT
    torch.manual_seed(0)
    theirs = SVT(embed_dims=list(TINY['embed_dims']), num_heads=list(TINY['num_heads']), mlp_ratios=[4, 4, 4, 4],
                 depths=list(TINY['depths']), sr_ratios=[8, 4, 2, 1], windiow_sizes=[7, 7, 7, 7], qkv_bias=True,
                 norm_after_stage=False, drop_path_rate=0.).eval()
    ours = tiny(features_only=True, norm_eps=1e-5, window_mask=True).eval()  # mmseg's blocks: LayerNorm eps 1e-5
    theirs.load_state_dict(native_to_mmseg(ours.state_dict()), strict=True)
    for h, w in [(224, 224), (96, 128)]:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            for a, b in zip(ours(x), theirs(x), strict=True):
                assert rel_l2(a, b) < 1e-5, (h, w)


def test_logits_equal_mmpretrain_svt_classifier():
    """mmpretrain's ``SVT`` classifier on our weights through our converter: equal logits, at 224 and (with
    ``window_mask=True``, where its mask applies) at 96 x 128."""
    pytest.importorskip('mmpretrain')
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    arch = dict(embed_dims=list(TINY['embed_dims']), depths=list(TINY['depths']), num_heads=list(TINY['num_heads']),
                patch_sizes=[4, 2, 2, 2], strides=[4, 2, 2, 2], mlp_ratios=[4, 4, 4, 4], sr_ratios=[8, 4, 2, 1],
                window_sizes=[7, 7, 7, 7])
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        theirs = MODELS.build(dict(
            type='ImageClassifier', neck=dict(type='GlobalAveragePooling'),
            backbone=dict(type='SVT', arch=arch, qkv_bias=True, norm_after_stage=[False, False, False, True]),
            head=dict(type='LinearClsHead', num_classes=1000, in_channels=128))).eval()
    ours = tiny(norm_eps=1e-5, window_mask=True).eval()  # mmpretrain's LayerNorms: eps 1e-5
    theirs.load_state_dict(native_to_mmpretrain(ours.state_dict()), strict=True)
    for h, w in [(224, 224), (96, 128)]:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            assert rel_l2(ours(x), theirs(x, mode='tensor')) < 1e-5, (h, w)


@pytest.mark.parametrize('framework', ['mmdet', 'mmseg', 'mmpretrain'])
def test_openmmlab_registration(framework):
    pytest.importorskip(framework)
    import importlib

    from mmengine.registry import DefaultScope
    importlib.import_module(f'cpvt_backbones.adapters.{framework}')
    importlib.import_module(f'{framework}.models')  # their own SVT registration must not clash
    cfg = dict(type='TwinsSVT', arch=dict(base='svt_small', **TINY, window_mask=True), out_indices=(1, 3),
               frozen_stages=1, drop_path_rate=0.1)
    with DefaultScope.overwrite_default_scope(framework):
        backbone = importlib.import_module(f'{framework}.registry').MODELS.build(cfg)
    assert isinstance(backbone, TwinsSVT) and backbone.blocks[0][0].attn.window_mask
    assert not backbone.blocks[0][0].attn.qkv.weight.requires_grad
    assert backbone.blocks[1][0].attn.qkv.weight.requires_grad
    outs = backbone(torch.randn(2, 3, 50, 75))
    assert [tuple(o.shape) for o in outs] == [(2, 32, 7, 10), (2, 128, 2, 3)]


def test_timm_registry_tags_and_features():
    timm = pytest.importorskip('timm')
    import cpvt_backbones.adapters.timm  # noqa: F401  (registers)
    assert {'svt_small.in1k', 'svt_base.in1k', 'svt_large.in1k'} <= set(timm.list_models(pretrained=True))
    cfg = timm.models.get_pretrained_cfg('svt_small.in1k')
    assert cfg.hf_hub_id == 'timm/twins_svt_small.in1k' and cfg.url.endswith('twins_svt_small-42e5f78c.pth')
    features = timm.create_model('svt_small', features_only=True, out_indices=(-2, -1), **TINY)
    assert features.feature_info.channels() == [64, 128] and features.feature_info.reduction() == [16, 32]
    assert [tuple(o.shape) for o in features(torch.randn(1, 3, 45, 61))] == [(1, 64, 3, 4), (1, 128, 2, 2)]


def test_pretrained_by_name_loads_through_the_checked_cache(tmp_path, monkeypatch):
    """``pretrained='svt_small'`` fetches the first published file into the cache, checked, and loads it strictly;
    a published mmseg file (no head, its sha256 prefix in its name) loads into a dense backbone by URL."""
    import hashlib
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from safetensors.torch import save_file
    served = tmp_path / 'served'
    served.mkdir()
    sd = tiny().state_dict()
    save_file(sd, served / 'model.safetensors')
    torch.save({'state_dict': native_to_mmseg(sd), 'meta': {}}, served / 'mmseg.pth')
    mmseg_name = f'alt_gvt_tiny-{hashlib.sha256((served / "mmseg.pth").read_bytes()).hexdigest()[:8]}.pth'
    (served / 'mmseg.pth').rename(served / mmseg_name)
    server = ThreadingHTTPServer(('127.0.0.1', 0), partial(SimpleHTTPRequestHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f'http://127.0.0.1:{server.server_address[1]}'
    table = (hub.WeightSource(f'{url}/model.safetensors', 'svt_tiny.in1k.safetensors', 'native'),
             hub.WeightSource(f'{url}/{mmseg_name}', mmseg_name, 'mmseg', mmseg_name[-12:-4], classifier=False))
    monkeypatch.setitem(hub.PRETRAINED, 'svt_small', table)
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(tmp_path / 'cache'))
    try:
        for model in (create_model('svt_small', pretrained='svt_small', **TINY),
                      create_model('svt_small', pretrained=table[1].url, features_only=True, **TINY)):
            assert all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())
    finally:
        server.shutdown()
        server.server_close()


def test_svt_through_the_hugging_face_smp_and_torchvision_adapters():
    """The same maps reach transformers' AutoBackbone, an SMP decoder at any size and torchvision's detectors
    (the ecosystems stack)."""
    pytest.importorskip('transformers')
    smp = pytest.importorskip('segmentation_models_pytorch')
    from torchvision.models.detection import MaskRCNN

    import cpvt_backbones.adapters.timm  # noqa: F401  (SMP's 'tu-' encoders)
    from cpvt_backbones.adapters.hf import CPVTBackbone, CPVTBackboneConfig
    from cpvt_backbones.adapters.smp import AnySize
    from cpvt_backbones.adapters.torchvision import cpvt_fpn_backbone
    torch.manual_seed(0)
    x = torch.randn(1, 3, 97, 131)
    hf = CPVTBackbone(CPVTBackboneConfig(arch='svt_small', out_features=['stage1', 'stage2', 'stage3', 'stage4']))
    ours = create_model('svt_small', features_only=True).eval()
    ours.load_state_dict(hf.model.state_dict())
    with torch.no_grad():
        maps = hf.eval()(x).feature_maps
        for theirs, mine in zip(maps, ours(x), strict=True):
            assert torch.equal(theirs, mine)
    assert [tuple(m.shape[1:]) for m in maps] == [(64, 25, 33), (128, 13, 17), (256, 7, 9), (512, 4, 5)]
    with torch.no_grad():
        assert AnySize(smp.FPN('tu-svt_small', encoder_weights=None, classes=3)).eval()(x).shape == (1, 3, 97, 131)
        detector = MaskRCNN(cpvt_fpn_backbone('svt_small', pretrained=None, out_channels=64), num_classes=3,
                            min_size=64, max_size=96).eval()
        (detections,) = detector([torch.rand(3, 61, 83)])
    assert set(detections) >= {'boxes', 'labels', 'scores', 'masks'}
