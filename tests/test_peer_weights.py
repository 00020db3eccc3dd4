"""Weight files as the peers' own converters write them load into our classifier and dense backbone.

The sources are timm ``twins_pcpvt_*`` state dicts (= the official layout). mmseg's converter is run from the
installed wheel, as mmseg made its published PCPVT weights; mmpretrain's ``twins2mmpretrain.py`` imports
``mmcv.runner`` (gone in mmcv 2), so its ``convert_twins`` is executed from the wheel's source with that one
import pointed at mmengine's ``CheckpointLoader``.
"""
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from tool_server import run_tool

from cpvt_backbones import create_model
from cpvt_backbones.convert import CheckpointMismatchError, detect_layout, load_weights_file

timm = pytest.importorskip('timm')
mmseg = pytest.importorskip('mmseg')
mmpretrain = pytest.importorskip('mmpretrain')

MMSEG_CONVERTER = Path(mmseg.__file__).parent / '.mim/tools/model_converters/twins2mmseg.py'
MMPRETRAIN_CONVERTER = Path(mmpretrain.__file__).parent / '.mim/tools/model_converters/twins2mmpretrain.py'


def timm_state_dict(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model = timm.create_model(name).eval()
    return model, model.state_dict()


@pytest.fixture(scope='module')
def timm_small():
    return timm_state_dict('twins_pcpvt_small')


@pytest.fixture(scope='module')
def source_file(tmp_path_factory, timm_small):
    path = tmp_path_factory.mktemp('timm') / 'twins_pcpvt_small.pth'
    torch.save(timm_small[1], path)
    return path


def run_mmseg_converter(src: Path, dst: Path, model: str = 'pcpvt') -> None:
    res = run_tool([MMSEG_CONVERTER, src, dst, model])
    assert res.returncode == 0, res.stderr[-3000:]


def mmpretrain_convert(state_dict):
    """mmpretrain's own ``convert_twins`` from the wheel's script."""
    import mmengine.runner
    stub = types.ModuleType('mmcv.runner')
    stub.CheckpointLoader = mmengine.runner.CheckpointLoader
    saved = sys.modules.get('mmcv.runner')
    sys.modules['mmcv.runner'] = stub
    try:
        spec = importlib.util.spec_from_file_location('twins2mmpretrain', MMPRETRAIN_CONVERTER)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules['mmcv.runner']
        else:
            sys.modules['mmcv.runner'] = saved
    return module.convert_twins(None, state_dict)


def save(state_dict, path: Path, wrapped: bool) -> Path:
    torch.save({'meta': {'mmengine_version': '0.10.7', 'epoch': 300}, 'state_dict': state_dict} if wrapped
               else state_dict, path)
    return path


def assert_same_weights(model, reference):
    for k, v in model.state_dict().items():
        assert torch.equal(v, reference[k]), k


@pytest.fixture(scope='module')
def mmseg_file(tmp_path_factory, source_file):
    dst = tmp_path_factory.mktemp('mmseg') / 'pcpvt_small_mmseg.pth'
    run_mmseg_converter(source_file, dst)
    return dst


@pytest.mark.parametrize('wrapped', [False, True])
def test_mmseg_converter_output_loads(tmp_path, timm_small, mmseg_file, wrapped):
    sd = load_weights_file(mmseg_file)
    assert detect_layout(sd) == 'mmseg' and 'norm.weight' in sd and 'layers.0.0.attn.attn.in_proj_weight' in sd
    path = save(sd, tmp_path / 'w.pth', wrapped)
    dense = create_model('pcpvt_small', features_only=True, pretrained=str(path))
    assert_same_weights(dense, timm_small[1])
    # The converter drops the head: the classifier without one loads strictly, one with a head names it.
    pooled = create_model('pcpvt_small', num_classes=0, pretrained=str(path))
    assert_same_weights(pooled, timm_small[1])
    with pytest.raises(CheckpointMismatchError, match=r'missing keys \(2\): head.bias, head.weight'):
        create_model('pcpvt_small', pretrained=str(path))
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        torch.testing.assert_close(pooled.eval()(x), timm_small[0].forward_head(timm_small[0].forward_features(x),
                                                                                   pre_logits=True),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('wrapped', [False, True])
def test_mmpretrain_converter_output_loads(tmp_path, timm_small, wrapped):
    sd = mmpretrain_convert(timm_small[1])
    assert 'head.fc.weight' in sd and 'backbone.norm_after_stage3.weight' in sd
    path = save(sd, tmp_path / 'w.pth', wrapped)
    classifier = create_model('pcpvt_small', pretrained=str(path)).eval()
    assert_same_weights(classifier, timm_small[1])
    dense = create_model('pcpvt_small', features_only=True, out_indices=(1, 2), pretrained=str(path))
    assert_same_weights(dense, timm_small[1])
    x = torch.randn(2, 3, 64, 96)  # timm floors odd sizes where we pad, so a size divisible by 32
    with torch.no_grad():
        torch.testing.assert_close(classifier(x), timm_small[0](x), rtol=1e-4, atol=1e-4)


def test_another_size_or_family_is_refused_with_its_keys(tmp_path, mmseg_file):
    with pytest.raises(CheckpointMismatchError, match=r'unexpected keys \(140\): blocks.0.2.*shape mismatches'):
        create_model('pcpvt_tiny', features_only=True, pretrained=str(mmseg_file))
    _, base = timm_state_dict('twins_pcpvt_base')
    base_file = save(base, tmp_path / 'base.pth', False)
    run_mmseg_converter(base_file, tmp_path / 'base_mmseg.pth')
    with pytest.raises(CheckpointMismatchError, match=r'unexpected keys \(\d+\): blocks.2.10.attn.kv.bias'):
        create_model('pcpvt_small', features_only=True, pretrained=str(tmp_path / 'base_mmseg.pth'))
    _, svt = timm_state_dict('twins_svt_small')
    svt_file = save(svt, tmp_path / 'svt.pth', False)
    run_mmseg_converter(svt_file, tmp_path / 'svt_mmseg.pth', 'svt')
    # an SVT file (its layout known since Twins-SVT is ours too) into PCPVT: refused with the other family's keys
    with pytest.raises(CheckpointMismatchError, match=r'unexpected keys \(\d+\): blocks.0.0.attn.qkv.bias'):
        create_model('pcpvt_small', features_only=True, pretrained=str(tmp_path / 'svt_mmseg.pth'))
