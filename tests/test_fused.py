"""The fused engine (``prepare(model, 'fused')``): the fused CPU path as a transform that keeps the weights and the
function."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cpvt_backbones import create_model, prepare, record_input_ranges
from cpvt_backbones.deploy import kernels as fused
from cpvt_backbones.deploy.engines.fused import pick_gemm
from cpvt_backbones.deploy.kernels import FusedBlock, FusedLinear
from cpvt_backbones.layers import Block

CASES = [('pcpvt_tiny', False), ('pcpvt_tiny', True), ('cpvt_tiny', False), ('cpvt_tiny_gap', False),
         ('cpvt_tiny', True)]


def pair(name: str, features_only: bool, gemm: str = 'auto'):
    torch.manual_seed(0)
    plain = create_model(name, features_only=features_only)
    return plain, prepare(copy.deepcopy(plain).eval(), 'fused', gemm=gemm)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize('gemm', fused.GEMMS)
@pytest.mark.parametrize('name,features_only', CASES)
def test_same_state_dict_and_outputs(name, features_only, gemm, monkeypatch):
    plain, fast = pair(name, features_only, gemm)
    assert not any(isinstance(m, (Block, nn.Linear)) for m in fast.modules())
    assert {m.kernel for m in fast.modules() if isinstance(m, FusedLinear)} == {gemm}
    ref_state, state = plain.state_dict(), fast.state_dict()
    assert list(state) == list(ref_state) and all(torch.equal(state[k], ref_state[k]) for k in state)
    calls = []
    kernel = fused.KERNELS[gemm]
    original = kernel.residual
    monkeypatch.setattr(kernel, 'residual', lambda *a: calls.append(1) or original(*a))
    x = torch.randn(2, 3, 97, 131)
    with torch.no_grad():
        for a, b in zip(as_tuple(plain.eval()(x)), as_tuple(fast.eval()(x)), strict=False):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
    assert len(calls) == sum(isinstance(m, FusedBlock) for m in fast.modules()), 'the fused path was not taken'


def test_auto_picks_one_library_for_the_whole_model():
    plain, fast = pair('pcpvt_tiny', True)
    assert len({m.kernel for m in fast.modules() if isinstance(m, FusedLinear)}) == 1
    assert pick_gemm(plain.blocks[0][0]) in fused.GEMMS
    # The swapped-in modules keep the mode of the ones they replace: an eval model stays on the fused path.
    evaluated = prepare(create_model('pcpvt_tiny').eval(), 'fused')
    assert not any(m.training for m in evaluated.modules())
    with pytest.raises(ValueError, match="gemm must be one of .* got 'blas'"):
        prepare(plain.eval(), 'fused', gemm='blas')


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_training_computes_the_same_gradients(name):
    plain, fast = pair(name, False)
    x = torch.randn(2, 3, 64, 48)
    for model in (plain, fast):
        model.train()
        model(x).square().mean().backward()
    for (n, p), q in zip(plain.named_parameters(), fast.parameters(), strict=False):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), n


def test_prepare_leaves_the_model_and_refuses_a_prepared_one():
    """The fused modules share the copy's parameters (same names, no second copy of a weight); the model given
    is left as it was, and a prepared model is refused, naming what it holds."""
    torch.manual_seed(0)
    model = create_model('pcpvt_tiny').eval()
    fast = prepare(model, 'fused')
    assert sum(isinstance(m, FusedBlock) for m in fast.modules()) == 8
    assert not any(isinstance(m, (FusedBlock, FusedLinear)) for m in model.modules())
    block = fast.blocks[0][0]
    assert block.mlp.fc1.weight is dict(fast.named_parameters())['blocks.0.0.mlp.fc1.weight']
    with pytest.raises(ValueError, match="prepared for an engine already .*the fused engine's FusedBlock at "
                                         "'blocks.0.0'"):
        prepare(fast, 'fused')


def test_mlp_chunks_cover_every_token(monkeypatch):
    """A token count that is not a multiple of the chunk size still runs every token through the MLP."""
    monkeypatch.setattr(fused, 'MLP_CHUNK_TOKENS', 7)
    torch.manual_seed(0)
    blk = Block(16, 2, 4., qkv_bias=True, sr_ratio=2).eval()
    x = torch.randn(3, 5 * 9, 16)
    for gemm in fused.GEMMS:
        fast = prepare(nn.ModuleDict(dict(block=blk)).eval(), 'fused', gemm=gemm)['block']
        with torch.no_grad():
            assert torch.allclose(fast(x, (5, 9)), blk(x, (5, 9)), atol=1e-5)


class Wrapper(nn.Module):
    def __init__(self, base):
        super().__init__()
        self.base = base

    def forward(self, x):
        return self.base(x)


def test_refuses_what_it_cannot_fuse_faithfully():
    torch.manual_seed(0)
    wrapped = create_model('pcpvt_tiny').eval()
    wrapped.blocks[1][0].mlp.fc1 = Wrapper(wrapped.blocks[1][0].mlp.fc1)
    with pytest.raises(ValueError, match=r'blocks\.1\.0\.mlp\.fc1 is a Wrapper'):
        prepare(wrapped, 'fused')
    assert not any(isinstance(m, (FusedBlock, FusedLinear)) for m in wrapped.modules()), 'left half-prepared'

    hooked = create_model('cpvt_tiny').eval()
    hooked.blocks[3].attn.q.register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match=r'blocks\.3\.attn\.q has forward hooks'):
        prepare(hooked, 'fused')

    with pytest.raises(ValueError, match='float32 CPU model.*float64'):
        prepare(create_model('cpvt_tiny').double().eval(), 'fused')
    with pytest.raises(ValueError, match='no cpvt_backbones transformer block'):
        prepare(nn.Sequential(nn.Linear(4, 4)).eval(), 'fused')
    with pytest.raises(ValueError, match='in evaluation mode: call model.eval'):
        prepare(create_model('cpvt_tiny'), 'fused')


def test_the_fused_engine_through_the_registry_and_not_the_config():
    """The fused engine is reached as every engine is, ``deploy.prepare`` on a built model (here an mmdet backbone);
    a config that still asks the backbone for it is refused with where to go instead."""
    pytest.importorskip('mmdet')
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope

    import cpvt_backbones.adapters.mmdet  # noqa: F401
    with DefaultScope.overwrite_default_scope('mmdet'):
        torch.manual_seed(0)
        plain = MODELS.build(dict(type='PyramidCPVT', arch='pcpvt_tiny')).eval()
        fast = prepare(copy.deepcopy(plain), 'fused')
        with pytest.raises(ValueError, match='the backbone takes no inference engine.*--engine fused'):
            MODELS.build(dict(type='PyramidCPVT', arch='pcpvt_tiny', optimize=True))
    assert sum(isinstance(m, FusedBlock) for m in fast.modules()) == 8
    x = torch.randn(1, 3, 75, 61)
    with torch.no_grad():
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain(x), fast(x), strict=False))


# Relative L2 error of each map against float32, on random weights; the trained demo models' accuracy in each
# precision is in docs/performance.md.
TOLERANCE = {'int8': 0.08}
# Each lower precision: the engine's precision and the kernel its linear layers run (int8: at calibrated ranges).
MODES = {'int8': ('int8', 'onednn_int8')}


def _precision_or_skip(mode):
    kernel = MODES[mode][1]
    if not fused.KERNELS[kernel].available():
        pytest.skip(f'{mode} cannot run here: {fused.unavailable_reason(kernel)}')


def calibrated(model: nn.Module, sizes=((64, 64), (40, 88), (2, 3))):
    """The input ranges of ``model``'s linear layers on random images of ``sizes``. Static ranges hold for
    inputs like the calibration data: the tiny size matters for the 1 x 1 test, almost all padding, whose
    activations full-size images do not predict (cpvt_tiny: 0.52 relative error at 1 x 1 when calibrated
    on the two larger sizes only, 0.03 with the tiny one)."""
    with record_input_ranges(model) as ranges:
        for hw in sizes:
            model(torch.randn(2, 3, *hw))
    return ranges


def lowered(plain: nn.Module, mode: str, **kwargs) -> nn.Module:
    ranges = calibrated(plain) if mode == 'int8' else None
    return prepare(plain, 'fused', MODES[mode][0], input_ranges=ranges, **kwargs)


@pytest.mark.parametrize('mode', list(MODES))
@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_lower_precision_at_odd_sizes_leaves_the_plain_model_alone(name, mode):
    _precision_or_skip(mode)
    torch.manual_seed(0)
    plain = create_model(name, features_only=True).eval()
    state = copy.deepcopy(plain.state_dict())
    fast = lowered(plain, mode)
    assert {m.kernel for m in fast.modules() if isinstance(m, FusedLinear)} == {MODES[mode][1]}
    assert fast.state_dict().keys() == state.keys()
    for hw in ((1, 1), (97, 131)):
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            for a, b in zip(fast(x), plain(x), strict=False):
                assert a.shape == b.shape and ((a - b).norm() / b.norm()) < TOLERANCE[mode], hw
    assert all(type(m) is not FusedLinear for m in plain.modules()) and any(type(m) is Block for m in plain.modules())
    assert all(torch.equal(v, state[k]) for k, v in plain.state_dict().items())
    copied = copy.deepcopy(fast)  # packed int8 weights survive a copy
    with torch.no_grad():
        x = torch.randn(1, 3, 40, 56)
        assert all(torch.equal(a, b) for a, b in zip(copied(x), fast(x), strict=False))


@pytest.mark.parametrize('mode', list(MODES))
def test_a_model_copied_under_inference_mode_runs_on_the_fused_engine(mode):
    """Weights made under ``torch.inference_mode()`` are inference tensors, which have no version counter: the
    lower-precision kernels still derive their weights from them (once), and match the plain model."""
    _precision_or_skip(mode)
    torch.manual_seed(0)
    plain = create_model('pcpvt_tiny').eval()
    with torch.inference_mode():
        copy_ = copy.deepcopy(plain)
    assert all(p.is_inference() for p in copy_.parameters())
    fast = lowered(copy_, mode)
    x = torch.randn(1, 3, 64, 80)
    with torch.inference_mode():
        out, again, ref = fast(x), fast(x), plain(x)
    assert torch.equal(out, again) and ((out - ref).norm() / ref.norm()) < TOLERANCE[mode]


def test_layers_kept_in_float32():
    _precision_or_skip('int8')
    fast = lowered(create_model('pcpvt_tiny').eval(), 'int8', keep_fp32=('blocks.0', 'head'))
    kernels = {n: m.kernel for n, m in fast.named_modules() if isinstance(m, FusedLinear)}
    assert all((k in fused.GEMMS) == n.startswith(('blocks.0.', 'head')) for n, k in kernels.items())


def test_static_int8_mlp_hands_uint8_from_one_gemm_to_the_next():
    """With both MLP layers static int8, the first GEMM applies GELU and quantizes for the second: the hidden
    activation never exists in float32, and the block still matches float32."""
    _precision_or_skip('int8')
    torch.manual_seed(0)
    plain = create_model('pcpvt_tiny').eval()
    fast = lowered(plain, 'int8')
    block = fast.blocks[1][0]
    x = torch.randn(50, block.mlp.fc1.in_features)
    kernel = fused.KERNELS['onednn_int8']
    with torch.no_grad():
        hidden = kernel.gelu_linear(block.norm2(x), block.mlp.fc1, block.mlp.fc2)
        assert hidden.dtype == torch.uint8 and hidden.shape == (50, block.mlp.fc1.out_features)
        part = x.clone()
        fused.fused_mlp(part, block.norm2, block.mlp.fc1, block.mlp.fc2)
        ref = x + plain.blocks[1][0].mlp(plain.blocks[1][0].norm2(x))
    assert ((part - ref).norm() / ref.norm()) < 0.02


def test_static_int8_needs_a_range_for_every_layer_it_quantizes():
    _precision_or_skip('int8')
    model = create_model('pcpvt_tiny').eval()
    ranges = calibrated(model)
    del ranges['blocks.2.1.mlp.fc2']
    with pytest.raises(ValueError, match=r'no range for 1 linear layer\(s\) \(blocks\.2\.1\.mlp\.fc2\)'):
        prepare(model, 'fused', 'int8', input_ranges=ranges)
    prepare(model, 'fused', 'int8', input_ranges=ranges, keep_fp32=('blocks.2.1.mlp.fc2',))
    with pytest.raises(ValueError, match="precision='fp32' does not use them"):
        prepare(model, 'fused', input_ranges=ranges)
    layer = FusedLinear(nn.Linear(8, 4), 'onednn_int8')
    with pytest.raises(RuntimeError, match='needs the range of the layer'), torch.no_grad():
        layer(torch.randn(3, 8))
    layer.input_range = (-1., 1.)
    with torch.no_grad():
        narrow = layer(torch.full((3, 8), 3.))
        layer.input_range = (-4., 4.)  # a new range is taken up: 3.0 is no longer saturated
        wide = layer(torch.full((3, 8), 3.))
        exact = F.linear(torch.full((3, 8), 3.), layer.weight, layer.bias)
    assert (wide - exact).abs().max() < (narrow - exact).abs().max()


def test_a_precision_the_fused_engine_does_not_run_is_refused_by_name(monkeypatch):
    """bf16 is not fused (the plain model under autocast runs it as fast): the error names the engines that run
    it; a precision this torch build cannot run names why, when the request is made."""
    model = create_model('pcpvt_tiny').eval()
    with pytest.raises(ValueError, match="engine 'fused' runs fp32, int8, not 'bf16'; bf16 runs on: torch"):
        prepare(model, 'fused', 'bf16')
    with pytest.raises(ValueError, match="precision must be one of .* got 'fp16'"):
        prepare(model, 'fused', 'fp16')
    monkeypatch.setattr(fused.KERNELS['onednn_int8'], 'available', lambda: False)
    with pytest.raises(RuntimeError, match="precision='int8' cannot run here: this torch"):
        prepare(model, 'fused', 'int8', input_ranges={})


def test_the_fused_engines_int8_calibrates_on_the_batches_it_is_given():
    _precision_or_skip('int8')
    plain = create_model('pcpvt_tiny').eval()
    batches = [torch.randn(1, 3, 64, 80, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    model = prepare(copy.deepcopy(plain), 'fused', 'int8', calibration=batches)
    assert {m.kernel for m in model.modules() if isinstance(m, FusedLinear)} == {'onednn_int8'}
    with record_input_ranges(plain) as ranges:
        for x in batches:
            plain(x)
    reference = prepare(plain, 'fused', 'int8', input_ranges=ranges)
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    with pytest.raises(ValueError, match='int8 quantizes activations at calibrated ranges'):
        prepare(copy.deepcopy(plain), 'fused', 'int8')


@pytest.mark.parametrize('mode', list(MODES))
def test_weights_loaded_after_prepare_are_the_ones_used(mode):
    """Weights loaded into a prepared model (a runner that loads a checkpoint after the engine is attached) are
    the ones used: the lower-precision copies follow the new weights."""
    _precision_or_skip(mode)
    torch.manual_seed(0)
    fast = lowered(create_model('pcpvt_tiny', features_only=True).eval(), mode)
    torch.manual_seed(1)
    trained = create_model('pcpvt_tiny', features_only=True).eval()
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        fast(x)  # the copies of the first weights are made
        fast.load_state_dict(trained.state_dict())
        for a, b in zip(fast(x), trained(x), strict=False):
            assert ((a - b).norm() / b.norm()) < TOLERANCE[mode]


@pytest.mark.parametrize('qmax', [255, 127])
def test_static_int8_quantizer_gives_torchs_codes(monkeypatch, qmax):
    """Activations are quantized in plain tensor arithmetic (torch's quantized tensors are deprecated): the codes
    equal ``torch.quantize_per_tensor``'s, ties to even and saturation included, capped at 127 where the CPU has
    no int8 dot products."""
    import warnings
    monkeypatch.setattr(fused, 'activation_qmax', lambda: qmax)
    scale, zero = 6 / 255, 120
    x = torch.cat([torch.randn(5000) * 3, torch.tensor([-20., 20., 0.]),
                   (torch.arange(-8, 8) + 0.5) * torch.tensor(scale, dtype=torch.float32)])  # ties, saturation
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        expected = torch.quantize_per_tensor(x, scale, zero, torch.quint8).int_repr().clamp_(max=qmax)
    codes = fused.OneDNNInt8.quantize(x, scale, zero)
    assert codes.dtype == torch.uint8 and torch.equal(codes, expected)
    assert codes.max() == qmax and codes.min() == 0


def small_svt(window_mask: bool = False, **kwargs) -> nn.Module:
    """A narrow Twins-SVT whose stages hold a windowed and a global block each: at 97 x 131 every stage's map
    needs window padding (25 x 33, 13 x 17, 7 x 9, 4 x 5 tokens), at 1 x 1 all but one token of each window is
    padding."""
    torch.manual_seed(0)
    return create_model('svt_small', embed_dims=(16, 32, 64, 128), depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                        window_mask=window_mask, **kwargs).eval()


@pytest.mark.parametrize('mode', ['fp32', 'int8'])
@pytest.mark.parametrize('window_mask', [False, True])
def test_svt_windowed_and_global_blocks_are_fused_at_odd_sizes(window_mask, mode, monkeypatch):
    """Both kinds of Twins-SVT block are fused (the windowed ones' attn.qkv becomes a FusedLinear, with the
    window padding and ``window_mask`` of the plain model): float32 to rounding, int8 within its tolerance, at
    sizes that pad every stage's windows and at 1 x 1; the state dict and the plain model stay as they were."""
    from cpvt_backbones.layers import LocallyGroupedAttention
    if mode == 'int8':
        _precision_or_skip(mode)
    plain = small_svt(window_mask, features_only=True)
    state = copy.deepcopy(plain.state_dict())
    fast = lowered(plain, mode) if mode == 'int8' else prepare(plain, 'fused')
    windowed = [m for m in fast.modules()
                if isinstance(m, FusedBlock) and isinstance(m.attn, LocallyGroupedAttention)]
    assert len(windowed) == 4 and sum(isinstance(m, FusedBlock) for m in fast.modules()) == 8
    assert all(type(b.attn.qkv) is FusedLinear and b.attn.window_mask is window_mask for b in windowed)
    assert not any(type(m) is nn.Linear for m in fast.modules())
    kernels = {m.kernel for m in fast.modules() if isinstance(m, FusedLinear)}
    assert len(kernels) == 1 and (mode == 'fp32' or kernels == {'onednn_int8'}), kernels
    calls = []
    kernel = fused.KERNELS[kernels.pop()]
    original = kernel.residual
    monkeypatch.setattr(kernel, 'residual', lambda *a: calls.append(1) or original(*a))
    tolerance = 1e-5 if mode == 'fp32' else TOLERANCE[mode]
    for hw in ((97, 131), (1, 1), (56, 84)):   # 56 x 84: the first stage's 14 x 21 tokens need no padding
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(hw[1]))
        with torch.no_grad():
            for a, b in zip(fast(x), plain(x), strict=True):
                assert a.shape == b.shape and float((a - b).norm() / b.norm()) < tolerance, hw
    assert len(calls) == 8 * 3, 'the fused path was not taken in every block'
    assert all(torch.equal(v, state[k]) for k, v in plain.state_dict().items())
    assert fast.state_dict().keys() == state.keys()
    assert any(type(m) is Block for m in plain.modules()), 'the plain model was changed'


def test_svt_fused_keeps_the_window_mask_semantics():
    """The fused model computes what its plain model computes with the mask it was built with: masked and unmasked
    windows differ where windows are padded (so the comparison sees the mask) and agree where none is."""
    unmasked, masked = small_svt(False), small_svt(True)
    masked.load_state_dict(unmasked.state_dict())
    fast = {m: prepare(model, 'fused') for m, model in ((False, unmasked), (True, masked))}
    with torch.no_grad():
        x = torch.randn(1, 3, 97, 131)
        assert float((masked(x) - unmasked(x)).norm() / unmasked(x).norm()) > 1e-3
        for flag, model in ((False, unmasked), (True, masked)):
            assert torch.allclose(fast[flag](x), model(x), atol=1e-5, rtol=1e-4), flag
        x = torch.randn(1, 3, 224, 224)  # 56, 28, 14, 7 tokens a side: no window is padded
        assert torch.allclose(fast[True](x), fast[False](x), atol=1e-5, rtol=1e-4)


def test_svt_refuses_a_wrapped_or_hooked_windowed_projection():
    model = small_svt()
    model.blocks[0][0].attn.qkv = Wrapper(model.blocks[0][0].attn.qkv)
    with pytest.raises(ValueError, match=r'blocks\.0\.0\.attn\.qkv is a Wrapper'):
        prepare(model, 'fused')
    assert not any(isinstance(m, (FusedBlock, FusedLinear)) for m in model.modules()), 'left half-prepared'
    hooked = small_svt()
    hooked.blocks[2][0].attn.qkv.register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match=r'blocks\.2\.0\.attn\.qkv has forward hooks'):
        prepare(hooked, 'fused')


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_the_fused_engines_int8_is_int8_with_autograd_on_or_off(name):
    """The fused int8 engine gives the same int8 outputs with autograd on as under ``torch.no_grad()`` (the
    quantized GEMMs run without it: no gradient flows back through them), not float32's; in training mode with
    autograd on it refuses by name instead of training float32."""
    _precision_or_skip('int8')
    torch.manual_seed(0)
    plain = create_model(name, features_only=True).eval()
    batches = [torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    model = prepare(plain, 'fused', 'int8', calibration=batches)
    x = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(9))
    assert torch.is_grad_enabled()
    with_grad = model(x)
    with torch.no_grad():
        without, reference = model(x), plain(x)
    for a, b, r in zip(with_grad, without, reference, strict=True):
        assert torch.equal(a, b)
        assert 1e-4 < float((a.detach() - r).norm() / r.norm()) < TOLERANCE['int8']
    head = FusedLinear(nn.Linear(8, 4), 'onednn_int8').eval()
    head.input_range = (-3., 3.)
    tokens = torch.randn(5, 8, requires_grad=True)
    out = head(tokens)
    with torch.no_grad():
        assert torch.equal(out, head(tokens)) and not torch.equal(out, F.linear(tokens, head.weight, head.bias))
    assert not out.requires_grad   # int8 does not backpropagate
    model.train()
    with pytest.raises(RuntimeError, match='runs static int8, which does not backpropagate.*does not train'):
        model(x)
    with torch.no_grad():
        model(x)
