"""The default model is a plain composition of modules: the tools users bring (hooks, wrappers, dynamic
quantisation, FLOP counters) see every layer, in training and in inference."""
import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cpvt_backbones import create_model
from cpvt_backbones.layers import Block

NAMES = ['pcpvt_tiny', 'cpvt_tiny']
HOOKED = ('attn', 'attn.q', 'attn.kv', 'attn.proj', 'mlp', 'mlp.fc1', 'mlp.fc2')


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return create_model(name)


def blocks(model: nn.Module):
    return [m for m in model.modules() if isinstance(m, Block)]


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('mode', ['train', 'eval_no_grad'])
def test_forward_hooks_fire_on_every_layer(name, mode):
    model = build(name).train(mode == 'train')
    calls = {path: 0 for path in HOOKED}
    for blk in blocks(model):
        for path in HOOKED:
            blk.get_submodule(path).register_forward_hook(
                lambda *_, p=path: calls.__setitem__(p, calls[p] + 1))
    with torch.set_grad_enabled(mode == 'train'):
        model(torch.randn(1, 3, 64, 48))
    assert calls == {path: len(blocks(model)) for path in HOOKED}


class LowRank(nn.Module):
    """A LoRA-style wrapper: ``base(x) + B(A(x))``, exposing no ``weight`` of its own."""

    def __init__(self, base: nn.Linear, rank: int = 4):
        super().__init__()
        self.base = base
        self.A = nn.Linear(base.in_features, rank, bias=False)
        self.B = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.B.weight, std=0.1)

    def forward(self, x):
        return self.base(x) + self.B(self.A(x))


@pytest.mark.parametrize('name', NAMES)
def test_a_wrapped_linear_layer_changes_the_output_and_trains(name):
    model = build(name)
    x = torch.randn(2, 3, 64, 48)
    model.eval()
    with torch.no_grad():
        before = model(x)
    for blk in blocks(model):
        blk.mlp.fc1 = LowRank(blk.mlp.fc1)
    with torch.no_grad():
        after = model(x)
    assert not torch.allclose(before, after, atol=1e-4)
    model.train()
    model(x).square().mean().backward()
    wrapped = [blk.mlp.fc1 for blk in blocks(model)]
    assert all(w.A.weight.grad is not None and w.A.weight.grad.abs().sum() > 0 for w in wrapped)


# Relative L2 error of int8 dynamic quantisation on the logits of these (random-init) models: measured
# 0.02 (pcpvt_tiny) and 0.06 (cpvt_tiny); a broken quantised path gives errors of order 1.
INT8_REL_TOL = 0.15


@pytest.mark.parametrize('name', NAMES)
def test_int8_dynamic_quantisation(name):
    model = build(name).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        ref = model(x)
    with warnings.catch_warnings():  # torch.ao's eager quantisation is deprecated in favour of torchao
        warnings.simplefilter('ignore')
        quantised = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    dynamic = torch.ao.nn.quantized.dynamic.Linear
    assert sum(isinstance(m, dynamic) for m in quantised.modules()) == linears > 0
    with torch.no_grad():
        out = quantised(x)
    assert ((out - ref).norm() / ref.norm()).item() < INT8_REL_TOL


@pytest.mark.parametrize('name', NAMES)
def test_flop_counter_counts_every_linear_layer(name):
    """FlopCounterMode's GEMM count equals 2 * tokens * in * out summed over the linear layers that ran."""
    model = build(name).eval()
    expected = []
    for layer in (m for m in model.modules() if isinstance(m, nn.Linear)):
        layer.register_forward_hook(
            lambda m, inp, out: expected.append(2 * inp[0].numel() // m.in_features * m.in_features * m.out_features))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(2, 3, 64, 96))
    counts = {str(op): n for op, n in counter.get_flop_counts()['Global'].items()}
    assert counts.get('aten.addmm', 0) + counts.get('aten.mm', 0) == sum(expected) > 0


@pytest.mark.parametrize('name', NAMES)
def test_mmengine_flop_analyzer_sees_every_linear_layer(name):
    """mmdet's get_flops.py path: every q/kv/proj/fc1/fc2 is called and has its multiply-adds in the
    per-module table (tokens * in * out)."""
    pytest.importorskip('mmengine')
    from mmengine.analysis import FlopAnalyzer
    model = build(name).eval()
    analyzer = FlopAnalyzer(model, (torch.randn(1, 3, 64, 96),))
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    layers = {f'{name}.{path}': block.get_submodule(path) for name, block in model.named_modules()
              if isinstance(block, Block) for path in ('attn.q', 'attn.kv', 'attn.proj', 'mlp.fc1', 'mlp.fc2')}
    tokens = {}
    for n, layer in layers.items():
        layer.register_forward_hook(lambda m, inp, out, n=n: tokens.__setitem__(n, inp[0].numel() // m.in_features))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 96))
    by_module, uncalled = analyzer.by_module(), analyzer.uncalled_modules()
    assert len(tokens) == len(layers) == 5 * len(blocks(model))
    for n, layer in layers.items():
        assert n not in uncalled and by_module[n] == tokens[n] * layer.in_features * layer.out_features, n


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_block_parts_are_passed_by_keyword(name):
    """A new attention, MLP or norm is a class handed to the model: every block builds and calls it, and
    the fused engine refuses to fuse around it (it would bypass the part)."""
    from cpvt_backbones import prepare
    from cpvt_backbones.layers import Attention, Mlp
    from cpvt_backbones.layers.valid import WHOLE

    calls = []

    class CountingAttention(Attention):   # an attention takes the block's region (layers.valid) as well
        def forward(self, x, hw, pos=None, region=WHOLE):
            calls.append(hw)
            return super().forward(x, hw, pos, region)

    class RMSNorm(nn.Module):  # torch's nn.RMSNorm needs torch >= 2.4
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class ReluMlp(Mlp):
        def __init__(self, dim, hidden_dim, drop=0., act_layer=nn.GELU):
            super().__init__(dim, hidden_dim, drop)
            self.act = nn.ReLU()

    model = create_model(name, attn_layer=CountingAttention, mlp_layer=ReluMlp,
                         norm_layer=RMSNorm).eval()
    blocks = [b for b in model.modules() if type(b).__name__ == 'Block']
    assert blocks and all(isinstance(b.attn, CountingAttention) and isinstance(b.norm1, RMSNorm)
                          and isinstance(b.mlp.act, nn.ReLU) for b in blocks)
    with torch.no_grad():
        model(torch.randn(1, 3, 50, 70))
    assert len(calls) == len(blocks)
    with pytest.raises(ValueError, match=r'norm1 is a RMSNorm, not a plain LayerNorm'):
        prepare(model, 'fused')


@pytest.mark.parametrize('name, features_only', [('pcpvt_tiny', False), ('pcpvt_tiny', True), ('cpvt_tiny', False),
                                                 ('cpvt_tiny', True)])
def test_norm_layer_and_act_layer_reach_every_norm_and_mlp(name, features_only):
    """``norm_layer`` builds every token norm (blocks, final norm, patch embeddings, attention's reduction),
    at ``norm_eps`` where the default model uses it, and ``act_layer`` every activation; the state-dict keys
    stay those of the default model."""
    class OtherNorm(nn.LayerNorm):
        pass

    norm_eps = 1e-4
    model = create_model(name, norm_layer=OtherNorm, act_layer=nn.SiLU, norm_eps=norm_eps,
                         features_only=features_only)
    default = create_model(name, features_only=features_only)
    assert list(model.state_dict()) == list(default.state_dict())
    for n, m in default.named_modules():
        twin = model.get_submodule(n)
        if type(m) is nn.LayerNorm:
            assert type(twin) is OtherNorm, n
            assert twin.eps == (1e-5 if m.eps == 1e-5 else norm_eps), n  # a norm at its default eps keeps it
        if isinstance(m, nn.GELU):
            assert isinstance(twin, nn.SiLU), n
    assert any(type(m) is nn.LayerNorm and m.eps == 1e-5 for m in default.modules()) == (name == 'pcpvt_tiny')
    with torch.no_grad():
        assert [o.shape for o in model(torch.randn(1, 3, 45, 61))] == \
            [o.shape for o in default(torch.randn(1, 3, 45, 61))]
