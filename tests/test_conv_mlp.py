"""The convolutional feed-forward (``layers.mlp.ConvMlp``, PVTv2's): a block hands it the token grid, it convolves
the hidden map with zero padding, and a padded batch gives every image what it gets alone."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cpvt_backbones.layers import Block, ConvMlp, Mlp
from cpvt_backbones.layers.valid import WHOLE
from cpvt_backbones.models import CPVT, PyramidCPVT


def _reference(mlp: ConvMlp, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """fc1, the depthwise convolution of the last h * w tokens as an NCHW map (zero padding), GELU, fc2."""
    hidden = mlp.fc1(x)
    prefix = x.shape[1] - hw[0] * hw[1]
    grid = hidden[:, prefix:].transpose(1, 2).reshape(x.shape[0], -1, *hw)
    conv = F.conv2d(grid, mlp.dwconv.weight, mlp.dwconv.bias, padding=1, groups=grid.shape[1])
    hidden = torch.cat((hidden[:, :prefix], conv.flatten(2).transpose(1, 2)), dim=1)
    return mlp.fc2(F.gelu(hidden))


@pytest.mark.parametrize('prefix', [0, 1])
@pytest.mark.parametrize('hw', [(5, 7), (1, 1), (3, 2)])
def test_conv_mlp_convolves_the_hidden_map_and_passes_prefix_tokens_by(hw, prefix):
    torch.manual_seed(0)
    mlp = ConvMlp(8, 12).eval()
    x = torch.randn(2, prefix + hw[0] * hw[1], 8)
    out = mlp(x, hw)
    assert out.shape == x.shape
    torch.testing.assert_close(out, _reference(mlp, x, hw), rtol=1e-5, atol=1e-6)
    if prefix:   # the class token skips the convolution: its output reads only itself
        torch.testing.assert_close(out[:, 0], mlp.fc2(F.gelu(mlp.fc1(x[:, 0]))), rtol=1e-5, atol=1e-6)


def test_conv_mlp_sees_its_neighbours_and_the_zero_border():
    """Unlike a plain MLP, a token's output depends on its neighbours, and on a uniform input the border tokens
    differ from the interior ones (the zero padding marks the border), as a PEG's do."""
    torch.manual_seed(0)
    mlp = ConvMlp(4, 8).eval()
    x = torch.randn(1, 5 * 5, 4)
    moved = x.clone()
    moved[0, 6] += 1.                                   # token (1, 1): its neighbour (2, 2) sees it, (4, 4) does not
    diff = (mlp(moved, (5, 5)) - mlp(x, (5, 5)))[0].abs().sum(-1).reshape(5, 5)
    assert diff[2, 2] > 0 and diff[4, 4] == 0
    flat = mlp(torch.ones(1, 25, 4), (5, 5))[0].reshape(5, 5, 4)
    assert torch.allclose(flat[1, 1], flat[3, 3]) and not torch.allclose(flat[0, 0], flat[2, 2])


def test_parameter_count_follows_the_formula():
    for dim, hidden, k in ((16, 64, 3), (24, 40, 5), (8, 8, 1)):
        mlp = ConvMlp(dim, hidden, kernel_size=k)
        assert sum(p.numel() for p in mlp.parameters()) == 2 * dim * hidden + hidden * (k * k + 2) + dim
    with pytest.raises(ValueError, match='kernel_size must be odd'):
        ConvMlp(8, 8, kernel_size=4)


class _Recording(nn.Module):
    takes_grid = True

    def __init__(self, dim, hidden_dim, drop=0., act_layer=nn.GELU):
        super().__init__()
        self.seen = []

    def forward(self, x, hw, valid=None):
        self.seen.append((tuple(hw), valid))
        return torch.zeros_like(x)


def test_a_block_hands_the_grid_only_to_an_mlp_that_declares_it():
    block = Block(8, 2, mlp_layer=_Recording).eval()
    block(torch.randn(2, 1 + 3 * 4, 8), (3, 4))
    assert block.mlp.seen == [((3, 4), WHOLE)]
    plain = Block(8, 2, mlp_layer=Mlp).eval()       # a plain MLP is called with the tokens alone, as before
    x = torch.randn(2, 12, 8)
    torch.testing.assert_close(plain(x, (3, 4)), (lambda y: y + plain.mlp(plain.norm2(y)))(
        x + plain.attn(plain.norm1(x), (3, 4))))


@pytest.mark.parametrize('class_token', [True, False], ids=['cls', 'gap'])
def test_a_cpvt_with_conv_mlps_runs_at_odd_sizes_with_no_position_encoding(class_token):
    torch.manual_seed(0)
    model = CPVT(embed_dim=16, depth=2, num_heads=2, patch_size=4, num_classes=5, class_token=class_token,
                 mlp_layer=ConvMlp, pos_encoding='none').eval()
    assert not model.pos_encodings and all(isinstance(b.mlp, ConvMlp) for b in model.blocks)
    for h, w in ((37, 53), (4, 4), (21, 9)):
        x = torch.randn(2, 3, h, w)
        assert model(x).shape == (2, 5)
        tokens = -(-h // 4) * -(-w // 4)
        assert model.forward_features(x).shape == (2, int(class_token) + tokens, 16)


def _padded(images, fill):
    H, W = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
    x = torch.full((len(images), 3, H, W), fill)
    for b, image in enumerate(images):
        x[b, :, :image.shape[1], :image.shape[2]] = image
    return x


@pytest.mark.parametrize('class_token', [True, False], ids=['cls', 'gap'])
def test_a_padded_batch_gives_each_image_what_it_gets_alone(class_token):
    """The convolution sees zeros beyond each image's region (not the padding's values or the next image's
    content): outputs and features on the valid region equal each image's alone."""
    torch.manual_seed(0)
    model = CPVT(embed_dim=16, depth=2, num_heads=2, patch_size=4, num_classes=5, class_token=class_token,
                 mlp_layer=ConvMlp, pos_encoding='none').eval()
    sizes = [(1, 1), (23, 37), (40, 28)]
    g = torch.Generator().manual_seed(0)
    images = [torch.randn(3, h, w, generator=g) for h, w in sizes]
    with torch.no_grad():
        batched = model(_padded(images, 3.), valid_sizes=sizes)
        features = model.forward_features(_padded(images, 3.), valid_sizes=sizes)
        for b, image in enumerate(images):
            torch.testing.assert_close(batched[b:b + 1], model(image[None]), rtol=1e-5, atol=1e-5)
            alone = model.forward_features(image[None])
            h, w = -(-sizes[b][0] // 4), -(-sizes[b][1] // 4)
            prefix = int(class_token)
            grid = features[b, prefix:].reshape(10, 10, 16)
            torch.testing.assert_close(grid[:h, :w].reshape(1, h * w, 16), alone[:, prefix:], rtol=1e-5, atol=1e-5)
            assert not grid[h:].any() and not grid[:, w:].any()


def test_a_pyramid_model_hands_each_stage_its_grid():
    torch.manual_seed(0)
    model = PyramidCPVT(embed_dims=(8, 16, 24, 32), num_heads=(1, 1, 1, 1), depths=(1, 1, 1, 1),
                        mlp_ratios=(2, 2, 2, 2), num_classes=3, mlp_layer=ConvMlp).eval()
    sizes = [(45, 61), (64, 33)]
    g = torch.Generator().manual_seed(1)
    images = [torch.randn(3, h, w, generator=g) for h, w in sizes]
    with torch.no_grad():
        batched = model(_padded(images, -2.), valid_sizes=sizes)
        for b, image in enumerate(images):
            torch.testing.assert_close(batched[b:b + 1], model(image[None]), rtol=1e-5, atol=1e-5)


def test_the_fused_engine_refuses_a_conv_mlp_by_name():
    """The fused MLP computes fc2(act(fc1(x))): it would silently skip the convolution, so it refuses."""
    from cpvt_backbones import prepare
    model = CPVT(embed_dim=32, depth=2, num_heads=2, num_classes=3, pos_encoding='none', mlp_layer=ConvMlp).eval()
    with pytest.raises(ValueError, match=r'blocks\.0\.mlp is a ConvMlp, not a plain Mlp'):
        prepare(model, 'fused')
