"""Deployment at any resolution: ONNX with dynamic batch/height/width, torch.compile with dynamic shapes."""
from pathlib import Path

import pytest
import torch
from tool_server import run_tool

from cpvt_backbones import create_model
from cpvt_backbones.compat import supports

ROOT = Path(__file__).resolve().parents[1]
SIZES = [(64, 96), (97, 131), (160, 160)]  # 97 x 131 is not a multiple of 32 (nor of 4); the first is not square:
# dynamo gives equal sizes one symbol ("duck sizing"), so a square first input would tie H to W
# Tracing time grows with the number of blocks, and every block is the same code: shallow models keep every
# path (all stages, PEGs, spatial reduction, class token, the simple pyramid) at a fraction of the time.
SHALLOW = {'pcpvt_tiny': dict(depths=(1, 1, 1, 1)),
           'cpvt_tiny': dict(depth=2, pos_encoding=dict(type='peg', positions=(0, 1))),
           'svt_small': dict(embed_dims=(16, 32, 64, 128), depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)),
           'pvt_v2_b0': dict(depths=(1, 1, 1, 1))}
# The sizes a file with a sizes input is checked at, in one padded batch: a single pixel, a thin strip, a size that
# is no multiple of any stride, and a detector's test scale.
PADDED = [(1, 1), (7, 500), (97, 131), (800, 1216)]


def shallow(name: str):
    torch.manual_seed(0)
    model = create_model(name, features_only=True, **SHALLOW[name]).eval()
    return model, [f'stride{s}' for s in model.strides]


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])   # SVT's export: tests/test_engines.py (onnxruntime)
def test_onnx_backbone_at_three_sizes(name, tmp_path):
    pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    import onnx

    from cpvt_backbones.deploy.onnx import export, verify

    model, names = shallow(name)
    path = str(tmp_path / f'{name}.onnx')
    export(model, path, names)
    graph = onnx.load(path).graph
    assert [o.name for o in graph.output] == ['stride4', 'stride8', 'stride16', 'stride32']
    dims = graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims][1] == 3
    assert all(d.dim_param for i, d in enumerate(dims) if i != 1), 'batch, height and width must be dynamic'
    assert verify(model, path, SIZES, batch=1) < 1e-3
    assert verify(model, path, [(33, 47)], batch=3) < 1e-3


@pytest.mark.parametrize('name', sorted(SHALLOW))
def test_onnx_with_sizes_gives_each_image_of_a_padded_batch_what_it_gets_alone(name, tmp_path):
    """A file exported with a ``sizes`` input (every family): one padded batch of 1 x 1, 7 x 500, 97 x 131 and
    800 x 1216 gives each image, on its region of every map, its maps alone in PyTorch, and zeros beyond. The
    positive control: what a file without ``sizes`` computes (the model without valid sizes, which
    ``test_onnx_backbone_at_three_sizes`` holds such a file to) gives the 1 x 1 image the padding's answer."""
    pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    import onnxruntime as ort

    from cpvt_backbones.deploy.onnx import export, verify

    model, names = shallow(name)
    path = str(tmp_path / f'{name}.onnx')
    export(model, path, names, sizes_input=True)
    inputs = ort.InferenceSession(path, providers=['CPUExecutionProvider']).get_inputs()
    assert [(i.name, i.type) for i in inputs] == [('image', 'tensor(float)'), ('sizes', 'tensor(int64)')]
    assert verify(model, path, PADDED) < 1e-3
    batch = torch.randn(2, 3, 97, 131)
    with torch.no_grad():
        padded, alone = model(batch), model(batch[1:, :, :1, :1])
    assert (padded[0][1:, :, :1, :1] - alone[0]).abs().max() > 1e-3


def test_onnx_with_sizes_refuses_a_path_that_runs_image_by_image(tmp_path):
    """A model whose valid-size path works image by image in Python (a learned position table) is refused by name
    before any file is written."""
    from cpvt_backbones.deploy.onnx import export
    model = create_model('cpvt_tiny', depth=1, pos_encoding='learned', features_only=True).eval()
    with pytest.raises(ValueError, match='cannot be exported with a sizes input: its valid-size path does not trace'):
        export(model, str(tmp_path / 'x.onnx'), ['stride16'], sizes_input=True)
    assert not list(tmp_path.iterdir())


@pytest.mark.heavy
def test_onnx_cli_exports_a_whole_detector(tmp_path):
    pytest.importorskip('mmdet')
    pytest.importorskip('onnxruntime')
    out = tmp_path / 'retinanet.onnx'
    res = run_tool([ROOT / 'tools/export_onnx.py', ROOT / 'configs/shapes/retinanet_pcpvt-tiny_fpn_shapes.py', out,
                    '--verify', '97x131', '128'], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    diffs = [float(line.rsplit(' ', 1)[1]) for line in res.stdout.splitlines() if 'max abs diff' in line]
    assert len(diffs) == 2 and max(diffs) < 1e-3, res.stdout
    assert '10 outputs' in res.stdout  # 5 levels x (cls_score, bbox_pred)


def test_export_cli_rejects_unknown_model(tmp_path):
    res = run_tool([ROOT / 'tools/export_onnx.py', 'pcpvt_huge', tmp_path / 'x.onnx'])
    assert res.returncode != 0 and "'pcpvt_huge' is neither a config" in res.stderr


@pytest.mark.parametrize('name', ['pcpvt_tiny', 'cpvt_tiny'])
def test_compile_dynamic_one_graph_for_every_size(name):
    """One graph (fullgraph: no breaks) serves three sizes, one of them odd; outputs equal eager."""
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model, _ = shallow(name)
    compiled = torch.compile(model, dynamic=True, fullgraph=True, backend=counting_backend)
    for h, w in SIZES:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            got, ref = compiled(x), model(x)
        assert [o.shape for o in got] == [o.shape for o in ref]
        for a, b in zip(got, ref, strict=False):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (h, w, (a - b).abs().max())
    if supports('one_graph_compile'):
        assert len(graphs) == 1, f'{len(graphs)} graphs for {len(SIZES)} sizes'
    torch._dynamo.reset()
