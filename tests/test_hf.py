"""The native transformers backbone (``cpvt_backbones.adapters.hf``): conventions, weights, saving and loading,
and transformers' dense models built on it. Nothing here reaches the Hugging Face Hub."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ['HF_HUB_OFFLINE'] = '1'
transformers = pytest.importorskip('transformers')

from cpvt_backbones import create_model  # noqa: E402
from cpvt_backbones.adapters.hf import CPVTBackbone, CPVTBackboneConfig  # noqa: E402
from cpvt_backbones.convert import CheckpointMismatchError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = ['stage1', 'stage2', 'stage3', 'stage4']
SIZES = [(97, 131), (513, 769)]


def backbone(arch='pcpvt_tiny', **kwargs):
    return CPVTBackbone(CPVTBackboneConfig(arch=arch, **kwargs)).eval()


def reference_of(bb):
    """``create_model(arch, features_only=True)`` holding the backbone's weights (its keys without ``model.``)."""
    ref = create_model(bb.config.arch, **bb.config.model_kwargs()).eval()
    ref.load_state_dict({k[len('model.'):]: v for k, v in bb.state_dict().items()}, strict=True)
    return ref


def test_svt_has_one_level_per_stage():
    """A Twins-SVT (a PyramidCPVT subclass) gives one feature map per stage, as many as its depths name."""
    from cpvt_backbones.adapters.hf import _num_levels
    assert _num_levels('svt_small', {}) == 4
    assert _num_levels('svt_small', dict(depths=(2, 2), embed_dims=(16, 32))) == 2
    torch.manual_seed(0)
    bb = backbone('svt_small', out_features=STAGES, model_args=dict(embed_dims=(16, 32, 64, 128),
                                                                    num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2)))
    ref = reference_of(bb)
    x = torch.randn(1, 3, 53, 75)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(bb(x).feature_maps, ref(x), strict=True))


@pytest.mark.parametrize('arch', ['pcpvt_tiny', 'cpvt_tiny'])
def test_stage_maps_are_create_models_outputs(arch):
    bb = backbone(arch, out_features=STAGES)
    assert all(k.startswith('model.') for k in bb.state_dict())
    ref = reference_of(bb)
    x = torch.randn(2, 3, 53, 75)
    with torch.no_grad():
        out = bb(x, output_hidden_states=True)
        expected = ref(x)
    assert len(out.feature_maps) == 4
    assert all(torch.equal(a, b) for a, b in zip(out.feature_maps, expected, strict=True))
    assert out.attentions is None
    assert [h.shape[-2:] for h in out.hidden_states[1:]] == [(-(-53 // s), -(-75 // s)) for s in (4, 8, 16, 32)]
    assert bb.channels == [m.shape[1] for m in expected] == list(ref.out_channels)
    stem_stride = 4 if arch.startswith('pcpvt') else 16
    assert out.hidden_states[0].shape[-2:] == (-(-53 // stem_stride), -(-75 // stem_stride))


def test_conventions_out_features_out_indices_hidden_states_return_dict():
    cfg = CPVTBackboneConfig(arch='pcpvt_tiny')
    assert cfg.stage_names == ['stem'] + STAGES
    assert (cfg.out_features, cfg.out_indices) == (['stage4'], [4])  # transformers' default: the last stage
    cfg = CPVTBackboneConfig(arch='pcpvt_tiny', out_indices=[1, 3])
    assert cfg.out_features == ['stage1', 'stage3']
    cfg = CPVTBackboneConfig(arch='pcpvt_tiny', out_features=['stem', 'stage2'])
    assert cfg.out_indices == [0, 2]
    bb = CPVTBackbone(cfg).eval()
    assert bb.channels == [32, 64] and bb.num_features == [32, 32, 64, 160, 256]
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        out = bb(x)
        assert out.hidden_states is None
        full = bb(x, output_hidden_states=True)
        maps, hidden = bb(x, output_hidden_states=True, return_dict=False)
        (only,) = bb(x, return_dict=False)
    assert len(full.hidden_states) == 5
    assert [m.shape[1] for m in full.hidden_states] == bb.num_features
    assert torch.equal(out.feature_maps[0], full.hidden_states[0])
    assert torch.equal(out.feature_maps[1], full.hidden_states[2])
    assert all(torch.equal(a, b) for a, b in zip(hidden, full.hidden_states, strict=False))
    assert all(torch.equal(a, b) for a, b in zip(maps + only, out.feature_maps + out.feature_maps, strict=False))
    bb.out_features = ['stage3', 'stage4']  # BackboneMixin's setter re-aligns the config
    assert bb.out_indices == [3, 4] and bb.channels == [160, 256]
    with pytest.raises(ValueError, match='no attention maps'):
        bb(x, output_attentions=True)


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match=r"out_features must be a subset of stage_names: \['stem', 'stage1'"):
        CPVTBackboneConfig(arch='pcpvt_tiny', out_features=['stage5'])
    with pytest.raises(ValueError, match='out_indices must be valid indices'):
        CPVTBackboneConfig(arch='pcpvt_tiny', out_indices=[5])
    with pytest.raises(ValueError, match='same order as stage_names'):
        CPVTBackboneConfig(arch='pcpvt_tiny', out_features=['stage2', 'stage1'])
    with pytest.raises(ValueError, match="unknown arch 'pcpvt_huge'; valid names: .*'pcpvt_tiny'"):
        CPVTBackboneConfig(arch='pcpvt_huge')
    with pytest.raises(ValueError, match=r"pcpvt_tiny takes no argument\(s\) \['embed_dim'\]"):
        CPVTBackboneConfig(arch='pcpvt_tiny', model_args=dict(embed_dim=8))
    with pytest.raises(ValueError, match=r"must not set \['out_indices'\]"):
        CPVTBackboneConfig(arch='pcpvt_tiny', model_args=dict(out_indices=(1,)))
    with pytest.raises(ValueError, match=r"fields of CPVTBackboneConfig: set them there \(drop_path_rate=\)"):
        CPVTBackboneConfig(arch='pcpvt_tiny', model_args=dict(drop_path_rate=0.1))


def test_config_fields_reach_the_model():
    cfg = CPVTBackboneConfig(arch='pcpvt_tiny', in_chans=1, pos_encoding='rope_mixed', drop_path_rate=0.1,
                             frozen_stages=1, model_args=dict(layer_scale_init=1e-5), out_features=STAGES)
    assert cfg.num_channels == 1
    bb = CPVTBackbone(cfg)
    ref = create_model('pcpvt_tiny', in_chans=1, pos_encoding='rope_mixed', drop_path_rate=0.1, frozen_stages=1,
                       layer_scale_init=1e-5, features_only=True)
    assert {k[len('model.'):]: v.shape for k, v in bb.state_dict().items()} == \
        {k: v.shape for k, v in ref.state_dict().items()}
    assert not any(p.requires_grad for p in bb.model.blocks[0].parameters())
    assert bb(torch.randn(1, 1, 33, 35)).feature_maps[0].shape == (1, 32, 9, 9)


def test_pretrained_file_loads_create_models_weights(tmp_path):
    torch.manual_seed(3)
    path = tmp_path / 'pcpvt_tiny.pth'
    torch.save(create_model('pcpvt_tiny').state_dict(), path)  # a classifier checkpoint: head and norm dropped
    bb = backbone(pretrained=str(path), out_features=STAGES)
    ref = create_model('pcpvt_tiny', features_only=True, pretrained=str(path)).eval()
    assert all(torch.equal(v, ref.state_dict()[k[len('model.'):]]) for k, v in bb.state_dict().items())
    x = torch.randn(1, 3, 41, 57)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(bb(x).feature_maps, ref(x), strict=False))
    torch.save(create_model('pcpvt_small').state_dict(), tmp_path / 'small.pth')
    with pytest.raises(CheckpointMismatchError, match='shape mismatches'):
        backbone(pretrained=str(tmp_path / 'small.pth'))


def test_save_pretrained_round_trip(tmp_path):
    bb = backbone('cpvt_tiny', pos_encoding='rope_axial', out_indices=[0, 2, 4])  # non-persistent buffers
    bb.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / 'config.json').read_text())
    assert saved['model_type'] == 'cpvt_backbones' and saved['out_features'] == ['stem', 'stage2', 'stage4']
    assert saved['auto_map'] == {'AutoConfig': 'cpvt_backbones_hf.CPVTBackboneConfig',
                                 'AutoBackbone': 'cpvt_backbones_hf.CPVTBackbone',
                                 'AutoModel': 'cpvt_backbones_hf.CPVTBackbone'}
    assert (tmp_path / 'cpvt_backbones_hf.py').is_file()
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        expected = bb(x).feature_maps
        loaded = CPVTBackbone.from_pretrained(tmp_path).eval()
        assert loaded.out_features == ['stem', 'stage2', 'stage4']
        assert all(torch.equal(a, b) for a, b in zip(loaded(x).feature_maps, expected, strict=False))
        auto = transformers.AutoModel.from_pretrained(tmp_path, trust_remote_code=True).eval()
        assert type(auto) is CPVTBackbone
        assert all(torch.equal(a, b) for a, b in zip(auto(x).feature_maps, expected, strict=True))
        config = transformers.AutoConfig.from_pretrained(tmp_path)
        assert type(config) is CPVTBackboneConfig
        assert type(transformers.AutoBackbone.from_config(config)) is CPVTBackbone
    try:  # transformers 5.24's AutoBackbone.from_pretrained asks the Hub about any name, local folders included
        auto = transformers.AutoBackbone.from_pretrained(tmp_path).eval()
    except Exception as err:  # noqa: BLE001 (which error depends on the huggingface_hub version)
        pytest.xfail(f'AutoBackbone.from_pretrained(folder) asks the Hub first: {type(err).__name__}: {err}')
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(auto(x).feature_maps, expected, strict=False))


def test_from_pretrained_ignores_the_configs_pretrained(tmp_path):
    path = tmp_path / 'w.pth'
    torch.save(create_model('pcpvt_tiny').state_dict(), path)
    bb = backbone(pretrained=str(path))
    bb.save_pretrained(tmp_path / 'saved')
    path.unlink()
    loaded = CPVTBackbone.from_pretrained(tmp_path / 'saved')
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in bb.state_dict().items())


FRESH = '''
import sys, torch
from transformers import AutoConfig, AutoModel
assert not any(m.startswith('cpvt_backbones') for m in sys.modules)
config = AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True)
model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
x, expected = torch.load(sys.argv[2])
with torch.no_grad():
    maps = model(x).feature_maps
assert all(torch.equal(a, b) for a, b in zip(maps, expected))
print(type(config).__module__, type(model).__name__, model.out_features)
'''


def test_fresh_process_loads_the_saved_folder_with_trust_remote_code(tmp_path):
    bb = backbone(out_features=['stage1', 'stage4'])
    bb.save_pretrained(tmp_path / 'saved')
    x = torch.randn(1, 3, 37, 29)
    with torch.no_grad():
        torch.save((x, bb(x).feature_maps), tmp_path / 'io.pt')
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE='1', HF_MODULES_CACHE=str(tmp_path / 'modules'),
               OMP_NUM_THREADS='1')
    run = subprocess.run([sys.executable, '-c', FRESH, str(tmp_path / 'saved'), str(tmp_path / 'io.pt')],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split('\n')[-2] == "cpvt_backbones.adapters.hf CPVTBackbone ['stage1', 'stage4']"


def test_importing_registers_only_our_type():
    """With transformers' modules imported first, importing the adapter adds our two registrations and changes
    nothing else."""
    code = '''
import huggingface_hub.dataclasses, transformers.backbone_utils, transformers.modeling_outputs  # third party first
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_BACKBONE_MAPPING, MODEL_MAPPING
mappings = (CONFIG_MAPPING, MODEL_FOR_BACKBONE_MAPPING, MODEL_MAPPING)  # register() writes their _extra_content
import sys, warnings, torch
def state():
    return (list(sys.path), [str(f) for f in warnings.filters], torch.get_default_dtype(), torch.get_num_threads(),
            torch.random.get_rng_state().sum().item())
before, before_state = [dict(m._extra_content) for m in mappings], state()
import cpvt_backbones.adapters.hf as hf
after = [dict(m._extra_content) for m in mappings]
assert state() == before_state
assert after[0] == {**before[0], 'cpvt_backbones': hf.CPVTBackboneConfig}, after[0]
assert after[1] == {**before[1], hf.CPVTBackboneConfig: hf.CPVTBackbone}, after[1]
assert after[2] == before[2]
'''
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1')
    run = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def backbone_config():
    return CPVTBackboneConfig(arch='pcpvt_tiny', out_features=STAGES)


def upernet():
    config = transformers.UperNetConfig(backbone_config=backbone_config(), hidden_size=32, auxiliary_channels=16,
                                        num_labels=3)
    return transformers.UperNetForSemanticSegmentation(config)


def mask2former():
    config = transformers.Mask2FormerConfig(
        backbone_config=backbone_config(), feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_layers=1,
        decoder_layers=2, num_attention_heads=2, dim_feedforward=64, encoder_feedforward_dim=64, num_queries=5,
        num_labels=3, train_num_points=100)
    return transformers.Mask2FormerForUniversalSegmentation(config)


def detr():
    config = transformers.DetrConfig(
        use_timm_backbone=False, backbone_config=backbone_config(), d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5,
        num_labels=3)
    return transformers.DetrForObjectDetection(config)


def labels(name, batch, h, w):
    if name == 'upernet':
        return dict(labels=torch.randint(0, 3, (batch, h, w)))
    if name == 'mask2former':
        return dict(mask_labels=[torch.randint(0, 2, (2, h, w)).float() for _ in range(batch)],
                    class_labels=[torch.tensor([0, 2]) for _ in range(batch)])
    return dict(labels=[dict(class_labels=torch.tensor([1]), boxes=torch.tensor([[0.5, 0.5, 0.2, 0.3]]))
                        for _ in range(batch)])


def cpvt_of(model):
    found = [m for m in model.modules() if isinstance(m, CPVTBackbone)]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize('name,build', [('upernet', upernet), ('mask2former', mask2former), ('detr', detr)])
def test_dense_models_take_the_backbone_at_odd_sizes_and_train(name, build):
    if name != 'upernet':
        pytest.importorskip('scipy')  # transformers' Hungarian matcher (Mask2Former's and DETR's losses)
    model = build()
    bb = cpvt_of(model)
    assert bb.channels == [32, 64, 160, 256]
    model.eval()
    for h, w in SIZES:
        with torch.no_grad():
            out = model(torch.randn(1, 3, h, w))
        if name == 'upernet':
            assert out.logits.shape == (1, 3, h, w)
        elif name == 'mask2former':
            assert out.masks_queries_logits.shape[:2] == (1, 5)
        else:
            assert out.logits.shape == (1, 5, 4) and out.pred_boxes.shape == (1, 5, 4)
    model.train()
    batch = 2 if name == 'upernet' else 1  # UperNet's pooling module has BatchNorm on 1 x 1 maps
    loss = model(torch.randn(batch, 3, *SIZES[0]), **labels(name, batch, *SIZES[0])).loss
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in bb.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert bb.model.patch_embeds[0].proj.weight.grad.abs().sum() > 0
