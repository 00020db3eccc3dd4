"""tools/visualize.py: the pictures are drawn from hooks on the plain model, for classifiers and dense backbones."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cpvt_backbones import create_model

pytest.importorskip('matplotlib')
ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location('visualize', ROOT / 'tools' / 'visualize.py')
visualize = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(visualize)


@pytest.fixture
def image(tmp_path):
    path = tmp_path / 'img.png'
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (75, 101, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize('name, dense', [('pcpvt_tiny', False), ('pcpvt_tiny', True), ('cpvt_tiny_gap', False),
                                         ('cpvt_tiny', True)])
def test_picture_for_classifiers_and_detector_checkpoints(tmp_path, image, name, dense):
    model = create_model(name, features_only=dense, **({} if dense else dict(num_classes=7)))
    state = model.state_dict()
    if dense:  # as a detector's checkpoint: our backbone under backbone.*, beside a neck and a head
        state = {**{f'backbone.{k}': v for k, v in state.items()}, 'neck.conv.weight': torch.zeros(1),
                 'bbox_head.cls.weight': torch.zeros(1)}
        state = {'state_dict': state, 'meta': {}}
        if importlib.util.find_spec('mmengine'):  # an mmengine checkpoint holds its log buffers too
            from mmengine.logging import HistoryBuffer

            # written as a run of our configs writes it, with the checkpoint opt-in imported (without it the
            # buffer pickles its numpy arrays, which safe_load refuses, whatever the order the tests ran in)
            import cpvt_backbones.adapters.checkpoint  # noqa: F401
            state['message_hub'] = {'log_scalars': {'train/loss': HistoryBuffer()}}
    torch.save(state, tmp_path / 'w.pth')
    out = visualize.main([str(tmp_path / 'w.pth'), str(image), '--queries', '0.3,0.6', '1,1',
                          '--out', str(tmp_path / 'pic.png')])
    assert Image.open(out).size[0] > 1000
    found, built = visualize.build(*visualize.backbone_weights(str(tmp_path / 'w.pth')))
    assert found == name and built.features_only == dense


def test_hooks_see_attention_and_peg_response(image):
    torch.manual_seed(0)
    model = create_model('pcpvt_tiny', num_classes=3).eval()
    for p in model.pos_block.parameters():
        torch.nn.init.normal_(p)
    rgb, x = visualize.read_image(str(image), (104, 76))  # a multiple of the patch: no padded tokens
    rec, feats = visualize.run(model, x)
    attn, (qi, qj) = visualize.attention_map(rec.qkv['stage 1, block 1'], (1.0, 1.0), 0)
    assert attn.shape == (3, 4) and abs(attn.sum() - 1) < 1e-5 and (qi, qj) == (18, 25)  # 19x26 tokens, sr 8
    assert [f[1].shape for f in feats] == [(19, 26), (10, 13), (5, 7), (3, 4)]
    grey, _ = visualize.run(model, (torch.full_like(x, 128.) - visualize.MEAN) / visualize.STD)
    _, response = grey.peg[0]
    # A uniform image: interior tokens are alike, so the response differs only where the zero padding reaches.
    assert np.allclose(response[1:-1, 1:-1], response[1, 1], rtol=1e-4)
    assert not np.isclose(response[0, 0], response[1, 1]) and not np.isclose(response[-1, 5], response[1, 1])
    assert not any(m._forward_hooks for m in model.modules())


def test_bad_query_is_refused(image, tmp_path, capsys):
    with pytest.raises(SystemExit):
        visualize.main(['w.pth', str(image), '--queries', '2,0.5'])
    assert 'query fractions must be within 0..1' in capsys.readouterr().err
