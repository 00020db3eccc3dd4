"""tools/infer.py and tools/test.py on the shapes configs with randomly initialised weights: every readable image
is run and every other one reported (exit status 1), no two images share an output, batches are predicted in one
call each, a rerun leaves only its own outputs of its images and removes the staging folders killed runs left, and
a checkpoint that does not fit the config's model is refused with every key that does not fit listed."""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

for _framework in ('mmengine', 'mmdet', 'mmseg'):
    pytest.importorskip(_framework)
from shapes_models import shapes_model  # noqa: E402
from test_training import DET, ROOT, SEG, run  # noqa: E402

from cpvt_backbones.convert import safe_load  # noqa: E402
from cpvt_backbones.datasets import ShapesSpec, generate_shapes  # noqa: E402

INFER, TEST = ROOT / 'tools/infer.py', ROOT / 'tools/test.py'
CONFIGS = [pytest.param(DET, id='mmdet'), pytest.param(SEG, id='mmseg')]


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """``checkpoint(cfg)``: an mmengine-style checkpoint of the shapes config's model with random weights (seed 0),
    written on the first request."""
    folder, paths = tmp_path_factory.mktemp('checkpoints'), {}

    def path(cfg):
        if cfg not in paths:
            paths[cfg] = folder / f'{cfg.stem}.pth'
            torch.save({'state_dict': shapes_model(cfg.name).state_dict(), 'meta': {}}, paths[cfg])
        return paths[cfg]
    return path


def save_image(path, width, height):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(width * height).integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def outputs(out_dir, kind):
    return {p.name: p for p in (out_dir / kind).iterdir()}


def image_size(path):
    with Image.open(path) as image:
        return image.size


@pytest.mark.parametrize('cfg', CONFIGS)
def test_infer_runs_every_readable_image_and_reports_each_other_one(cfg, checkpoint, tmp_path):
    """Unreadable images among readable ones, at the config's own scale: each gets one line naming its path and
    why, the run goes on and writes every readable image's prediction and drawing (the readable ones in one
    batch), and exits 1 after a summary."""
    images = tmp_path / 'images'
    save_image(images / 'a_good.png', 40, 30)
    (images / 'b_empty.png').write_bytes(b'')
    (images / 'c_text.png').write_text('not an image')
    save_image(images / 'd_good.jpg', 23, 57)
    (images / 'e_truncated.png').write_bytes((images / 'a_good.png').read_bytes()[:60])
    save_image(images / 'f_wide.png', 5000, 1)  # keep-ratio resize to the config's scale leaves no row
    out = tmp_path / 'out'
    res = run([INFER, cfg, checkpoint(cfg), images, '--out-dir', out], tmp_path)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    bad = {'b_empty.png': 'empty file', 'c_text.png': 'not an image', 'e_truncated.png': 'not an image',
           'f_wide.png': '5000 x 1 image: the test pipeline failed'}
    for name, reason in bad.items():
        (line,) = [x for x in res.stdout.splitlines() if x.startswith(f'[infer] {images / name}: ')]
        assert line.startswith(f'[infer] {images / name}: failed ({reason}'), line
    summary = res.stderr.strip().splitlines()[-1]
    assert summary == '4 of 6 image(s) failed: ' + ', '.join(str(images / name) for name in bad), summary
    # f_wide.png shares the good images' batch; its pipeline fails, so it is left out and the two still batch.
    batched = '[infer] 2 of 6 image(s) predicted in 1 padded batch(es) of up to 8, the others one at a time\n'
    assert batched in res.stdout, res.stdout[-3000:]
    pred = '.json' if cfg == DET else '.png'
    assert sorted(outputs(out, 'preds')) == [f'a_good{pred}', f'd_good{pred}']
    assert sorted(outputs(out, 'vis')) == ['a_good.png', 'd_good.jpg']
    assert sorted(p.name for p in out.iterdir()) == ['preds', 'vis']


@pytest.mark.parametrize('cfg', CONFIGS)
def test_infer_names_the_outputs_of_images_with_one_name_apart(cfg, checkpoint, tmp_path):
    """a/x.png and b/x.png: each gets its own prediction and drawing, named by its path under their common
    folder (the names printed); an image whose name no other shares keeps it; the exit status is 0."""
    sizes = {'a/x.png': (40, 30), 'b/x.png': (23, 57), 'a/y.png': (31, 31)}
    for name, (w, h) in sizes.items():
        save_image(tmp_path / name, w, h)
    out = tmp_path / 'out'
    res = run([INFER, cfg, checkpoint(cfg), tmp_path / 'a', tmp_path / 'b', '--out-dir', out], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    renamed = [line.split('] ', 1)[1].strip() for line in res.stdout.splitlines()
               if line.startswith('[infer]') and ' -> ' in line]
    assert renamed == [f'{tmp_path / "a/x.png"} -> a__x', f'{tmp_path / "b/x.png"} -> b__x'], res.stdout
    vis, preds = outputs(out, 'vis'), outputs(out, 'preds')
    named = {'a/x.png': 'a__x', 'b/x.png': 'b__x', 'a/y.png': 'y'}
    assert sorted(vis) == sorted(f'{n}.png' for n in named.values())
    assert sorted(preds) == sorted(f'{n}{".json" if cfg == DET else ".png"}' for n in named.values())
    for source, name in named.items():  # each output is its own image's: drawn (and segmented) at its size
        assert image_size(vis[f'{name}.png']) == sizes[source]
        if cfg == SEG:
            assert image_size(preds[f'{name}.png']) == sizes[source]
        else:
            assert set(json.loads(preds[f'{name}.json'].read_text())) >= {'labels', 'scores', 'bboxes'}


def recording(setup: str, variable: str) -> str:
    """A script that runs the tool named by its first argument (with the rest as its arguments) after ``setup``,
    which fills a list ``seen``, and writes that list as JSON to the file named by the environment variable
    ``variable`` when the tool ends."""
    return f"""
import json, os, runpy, sys
seen = []
{setup}
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
finally:
    with open(os.environ[{variable!r}], 'w') as f:
        json.dump(seen, f)
"""


# tools/infer.py with every call of the model's test_step counted: the number of images each call got, written as
# JSON to $CALLS_FILE when the tool ends.
COUNTING = recording("""
from mmengine.model import BaseModel
test_step = BaseModel.test_step


def counted(self, data):
    seen.append(len(data['inputs']))
    return test_step(self, data)


BaseModel.test_step = counted
""", 'CALLS_FILE')


@pytest.mark.parametrize('cfg', CONFIGS)
def test_infer_in_batches_gives_each_image_its_prediction_alone(cfg, checkpoint, tmp_path):
    """Five images of odd sizes at their own size, three at a time and one at a time: at three the model is
    called twice, on the two padded batches (3 and 2 images; no image runs alone), at one five times, and the
    predictions are the same (RetinaNet's score threshold at 0, so that random weights give boxes to compare)."""
    sizes = [(40, 30), (23, 57), (31, 31), (64, 20), (17, 45)]
    for i, (w, h) in enumerate(sizes):
        save_image(tmp_path / 'images' / f'{i}.png', w, h)
    (tmp_path / 'counting.py').write_text(COUNTING)
    options = ['--native'] + (['--cfg-options', 'model.test_cfg.score_thr=0'] if cfg == DET else [])
    for batch, calls in ((1, [1] * 5), (3, [3, 2])):
        res = run([tmp_path / 'counting.py', INFER, cfg, checkpoint(cfg), tmp_path / 'images', '--out-dir',
                   tmp_path / f'out{batch}', '--batch-size', batch, *options], tmp_path,
                  {'CALLS_FILE': str(tmp_path / f'calls{batch}.json')})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert json.loads((tmp_path / f'calls{batch}.json').read_text()) == calls, res.stdout[-3000:]
    assert '[infer] 5 of 5 image(s) predicted in 2 padded batch(es) of up to 3\n' in res.stdout, res.stdout[-3000:]
    for i in range(len(sizes)):
        if cfg == DET:
            one, three = (json.loads((tmp_path / f'out{b}/preds/{i}.json').read_text()) for b in (1, 3))
            assert len(one['scores']) == len(three['scores']) > 0 and one['labels'] == three['labels']
            assert np.allclose(one['scores'], three['scores'], atol=1e-5)
            assert np.allclose(one['bboxes'], three['bboxes'], atol=1e-3)
        else:
            one, three = (np.asarray(Image.open(tmp_path / f'out{b}/preds/{i}.png')) for b in (1, 3))
            assert one.shape == sizes[i][::-1] and np.array_equal(one, three)


def keys_listed(report, text):
    """Every missing, unexpected and mis-shaped key of ``report`` named in ``text``."""
    keys = report.missing + report.unexpected + [k for k, _, _ in report.mismatched]
    return keys and all(k in text for k in keys)


def test_infer_refuses_a_checkpoint_of_another_model(checkpoint, tmp_path):
    from cpvt_backbones.convert.loading import compare
    save_image(tmp_path / 'images' / 'x.png', 40, 30)
    out, wrong = tmp_path / 'out', checkpoint(DET)
    res = run([INFER, SEG, wrong, tmp_path / 'images', '--out-dir', out], tmp_path)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert f'checkpoint {wrong} (config {SEG}) does not fit the model' in res.stderr, res.stderr[-3000:]
    report = compare(shapes_model(SEG.name), safe_load(wrong)['state_dict'])
    assert keys_listed(report, res.stderr), res.stderr[-3000:]
    assert not (out / 'preds').exists()


def test_test_tool_refuses_a_checkpoint_of_another_model(checkpoint, tmp_path):
    """tools/test.py: the detector's checkpoint with the segmentor's config is refused before the test loop, every
    key that does not fit listed; the segmentor's own checkpoint, saved from a DDP-wrapped model (``module.``),
    is evaluated."""
    from cpvt_backbones.convert.loading import compare
    generate_shapes(tmp_path / 'data' / 'shapes', ShapesSpec(num_train=1, num_val=2, seed=1))
    wrong = checkpoint(DET)
    res = run([TEST, SEG, wrong, '--work-dir', tmp_path / 'wrong'], tmp_path)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert f'checkpoint {wrong} (config {SEG}) does not fit the model' in res.stderr, res.stderr[-3000:]
    report = compare(shapes_model(SEG.name), safe_load(wrong)['state_dict'])
    assert keys_listed(report, res.stderr) and 'mIoU: ' not in res.stdout + res.stderr, res.stderr[-3000:]
    wrapped = tmp_path / 'ddp.pth'
    state = safe_load(checkpoint(SEG))['state_dict']
    torch.save({'state_dict': {f'module.{k}': v for k, v in state.items()}, 'meta': {}}, wrapped)
    res = run([TEST, SEG, wrapped, '--work-dir', tmp_path / 'right'], tmp_path)
    assert res.returncode == 0 and 'mIoU: ' in res.stdout + res.stderr, res.stdout[-3000:] + res.stderr[-3000:]


def test_refuse_unfit_lists_every_key_that_does_not_fit():
    from cpvt_backbones.adapters.runner import refuse_unfit
    from cpvt_backbones.convert import CheckpointMismatchError
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(30)])
    state = model.state_dict()
    refuse_unfit(model, {'state_dict': state}, 'checkpoint c.pth')
    refuse_unfit(model, {f'module.{k}': v for k, v in state.items()}, 'checkpoint c.pth')  # as mmengine reads it
    wrong = {f'other.{k}': v for k, v in state.items()} | {'0.weight': torch.zeros(3, 2)}
    with pytest.raises(CheckpointMismatchError, match=r'^checkpoint c\.pth does not fit') as error:
        refuse_unfit(model, {'state_dict': wrong}, 'checkpoint c.pth')
    assert all(k in str(error.value) for k in list(state) + list(wrong))
    assert '0.weight checkpoint (3, 2) vs model (2, 2)' in str(error.value) and 'more)' not in str(error.value)


def test_unique_names():
    from cpvt_backbones.adapters.inference import unique_names
    assert unique_names(['in/a/x.png', 'in/b/y.png']) == ['x', 'y']
    assert unique_names(['in/a/x.png', 'in/b/x.png', 'in/a/y.png']) == ['a__x', 'b__x', 'y']
    assert unique_names(['in/a/X.png', 'in/b/x.png']) == ['a__X', 'b__x']  # apart where case is ignored too
    assert unique_names(['in/x.png', 'in/x.jpg', 'in/y.png']) == ['x_png', 'x_jpg', 'y']
    assert unique_names(['in/a/b/x.png', 'in/c/x.png']) == ['a__b__x', 'c__x']
    odd = ['in/a__x.png', 'in/a/x.png', 'in/b/x.png', 'in/a__x_png.png', 'in/a/x.jpg']
    names = unique_names(odd)
    assert len({n.casefold() for n in names}) == len(odd) and unique_names(odd) == names


def test_check_image(tmp_path):
    from cpvt_backbones.adapters.inference import ImageError, check_image
    save_image(tmp_path / 'good.png', 7, 3)
    assert check_image(tmp_path / 'good.png') == (3, 7)
    (tmp_path / 'empty.png').write_bytes(b'')
    (tmp_path / 'text.png').write_text('not an image')
    (tmp_path / 'cut.png').write_bytes((tmp_path / 'good.png').read_bytes()[:40])
    for name, reason in [('empty.png', 'empty file'), ('text.png', 'not an image'), ('cut.png', 'not an image'),
                         ('absent.png', 'cannot be read')]:
        with pytest.raises(ImageError, match=f'^{reason}'):
            check_image(tmp_path / name)


def write_outputs(image, folder):
    """A stand-in for an inferencer's run: a drawing and a prediction of ``image`` under ``folder``."""
    for kind, suffix in (('vis', Path(image).suffix), ('preds', '.json')):
        (Path(folder) / kind).mkdir(exist_ok=True)
        (Path(folder) / kind / f'{Path(image).stem}{suffix}').write_text(f'{kind} of {image}')


# A run of run_each killed (SIGKILL) while it runs its first image, as a killed tools/infer.py.
KILLED = """
import os, signal, sys
from cpvt_backbones.adapters.inference import run_each
run_each(lambda image, folder: os.kill(os.getpid(), signal.SIGKILL), [sys.argv[1]], ['x'], sys.argv[2])
"""


def test_a_run_removes_the_staging_folders_of_killed_runs_only(tmp_path, capsys):
    """A run killed mid-image leaves its staging folder; the next run into the same folder removes it, and says
    so, but not the staging folder of a run still running (whose lock is held), and leaves none of its own."""
    import fcntl
    import subprocess
    import sys

    from cpvt_backbones.adapters.inference import run_each
    save_image(tmp_path / 'x.png', 7, 5)
    out = tmp_path / 'out'
    killed = subprocess.run([sys.executable, '-c', KILLED, str(tmp_path / 'x.png'), str(out)], capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (left,) = out.glob('.staging-*')
    live = out / '.staging-running'
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert run_each(write_outputs, [str(tmp_path / 'x.png')], ['x'], str(out)) == []
    finally:
        os.close(fd)
    said = capsys.readouterr().out
    assert f'[infer] removed 1 staging folder(s) that runs which did not finish left in {out}: {left.name}' in said
    assert sorted(p.name for p in out.iterdir()) == ['.staging-running', 'preds', 'vis']
    assert sorted(p.name for p in (out / 'vis').iterdir()) == ['x.png']


def test_a_rerun_leaves_only_this_runs_outputs_of_its_images(tmp_path, capsys):
    """A second run into a used folder: an image that now fails loses the outputs the first run wrote for it (the
    line naming them), an image that runs again replaces its own and loses those of another extension, and an
    image of the first run only keeps its outputs."""
    from cpvt_backbones.adapters.inference import run_each
    for name in ('a.png', 'b.png', 'c.png', 'a.jpg'):
        save_image(tmp_path / 'in' / name, 7, 5)
    out = tmp_path / 'out'
    first = [str(tmp_path / 'in' / n) for n in ('a.jpg', 'b.png', 'c.png')]
    assert run_each(write_outputs, first, ['a', 'b', 'c'], str(out)) == []
    assert sorted(p.name for p in (out / 'vis').iterdir()) == ['a.jpg', 'b.png', 'c.png']

    def fails_on_b(image, folder):
        write_outputs(image, folder)
        if Path(image).stem == 'b':
            raise RuntimeError('b went wrong')

    second = [str(tmp_path / 'in' / n) for n in ('a.png', 'b.png')]
    assert run_each(fails_on_b, second, ['a', 'b'], str(out)) == [second[1]]
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith(f'[infer] {second[1]}: ')]
    assert line == [f'[infer] {second[1]}: failed (7 x 5 image: RuntimeError: b went wrong); nothing written for '
                    'it (its earlier outputs removed: vis/b.png, preds/b.json)'], line
    assert sorted(p.name for p in (out / 'vis').iterdir()) == ['a.png', 'c.png']
    assert sorted(p.name for p in (out / 'preds').iterdir()) == ['a.json', 'c.json']
    assert (out / 'vis' / 'a.png').read_text() == f'vis of {second[0]}'


@pytest.fixture(scope='module')
def shapes_dir(tmp_path_factory):
    """A folder holding the shapes data set (1 training, 2 validation images), where the tools run."""
    folder = tmp_path_factory.mktemp('shapes_run')
    generate_shapes(folder / 'data' / 'shapes', ShapesSpec(num_train=1, num_val=2, seed=1))
    return folder


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f'touch {self.marker}',))


def one_line(res, tool: str) -> str:
    """The tool's failure as its last stderr line, after checking it failed without a traceback."""
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert 'Traceback' not in res.stderr, res.stderr[-3000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith(f'{tool}: '), res.stderr[-3000:]
    return line


def test_user_errors_become_one_line_and_an_unwritable_output_folder_is_named(tmp_path, capsys):
    """In process (fast): what the tools wrap their loading in turns the errors a user can fix into one line
    headed by the tool's name; tools/infer.py's output check names the folder it cannot write."""
    import importlib.util
    import pickle

    from cpvt_backbones.convert.io import RefusedPickleError
    from cpvt_backbones.convert.loading import NonFiniteWeightsError, one_line_errors
    for error in (RefusedPickleError('w.pth: refused ... (posix.system)'), NonFiniteWeightsError('c.pth holds NaN'),
                  pickle.UnpicklingError('bad'), FileNotFoundError('weight file not found: x')):
        with pytest.raises(SystemExit) as info, one_line_errors('tool.py'):
            raise error
        assert str(info.value) == f'tool.py: {error}'
    with pytest.raises(KeyError), one_line_errors('tool.py'):  # a bug stays a traceback
        raise KeyError('x')
    spec = importlib.util.spec_from_file_location('infer_tool', INFER)
    infer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(infer)
    blocker = tmp_path / 'a_file'
    blocker.write_text('')
    with pytest.raises(SystemExit, match=f'^infer.py: cannot write the outputs under {blocker / "out"} .*{blocker}'):
        infer.writable_output(str(blocker / 'out'))
    infer.writable_output(str(tmp_path / 'fine' / 'out'))
    assert (tmp_path / 'fine' / 'out').is_dir()


@pytest.mark.heavy
def test_tools_name_the_problem_and_the_fix_in_one_line(checkpoint, shapes_dir, tmp_path):
    """A pickle that would run code (tools/test.py, tools/convert_checkpoint.py): one line naming the global,
    without torch's advice to load it with weights_only=False; a backbone setting the model does not take
    (drop_path_rte): the valid ones listed; NaN weights: refused by key (tools/infer.py); an output folder that
    cannot be written: its path named."""
    marker, evil = tmp_path / 'ran', tmp_path / 'evil.pth'
    torch.save({'state_dict': shapes_model(SEG.name).state_dict(), 'meta': _RunsCode(marker)}, evil)
    for tool, args in (('test.py', [TEST, SEG, evil, '--work-dir', tmp_path / 'w']),
                       ('convert_checkpoint.py', [ROOT / 'tools/convert_checkpoint.py', evil, tmp_path / 'c.pth'])):
        line = one_line(run(args, shapes_dir), tool)
        assert 'posix.system' in line and 'weights_only=False' not in line and str(evil) in line, line
    assert not marker.exists()
    line = one_line(run([TEST, SEG, checkpoint(SEG), '--work-dir', tmp_path / 'w', '--cfg-options',
                         'model.backbone.drop_path_rte=0.1'], shapes_dir), 'test.py')
    assert "has no setting(s) ['drop_path_rte']; valid settings: [" in line and "'drop_path_rate'" in line, line
    nan = tmp_path / 'nan.pth'
    state = shapes_model(SEG.name).state_dict()
    state['backbone.blocks.1.0.mlp.fc1.weight'][0, 0] = float('nan')
    torch.save({'state_dict': state, 'meta': {}}, nan)
    save_image(tmp_path / 'images' / 'x.png', 40, 30)
    line = one_line(run([INFER, SEG, nan, tmp_path / 'images', '--out-dir', tmp_path / 'out'], shapes_dir),
                    'infer.py')
    assert f'checkpoint {nan}' in line and 'backbone.blocks.1.0.mlp.fc1.weight' in line, line
    assert '--allow-nonfinite' in line
    blocker = tmp_path / 'a_file'
    blocker.write_text('')
    line = one_line(run([INFER, SEG, checkpoint(SEG), tmp_path / 'images', '--out-dir', blocker / 'out'], shapes_dir),
                    'infer.py')
    assert f'cannot write the outputs under {blocker / "out"}' in line and str(blocker) in line, line


@pytest.mark.heavy
def test_test_tool_evaluates_a_checkpoint_written_on_numpy_1(checkpoint, shapes_dir, tmp_path):
    """An mmengine checkpoint as the numpy 1.x stacks write it (numpy.core names: numpy scalars, arrays, numpy's
    generator state, mmengine's log buffers) is evaluated by tools/test.py on this stack's numpy."""
    from mmengine.logging import HistoryBuffer
    from test_reliability import numpy1_bytes, numpy_payload

    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (how mmengine checkpoints pickle their log buffers)
    payload = numpy_payload()
    buffer = HistoryBuffer()
    buffer.update(0.25)
    payload.update(state_dict=safe_load(checkpoint(SEG))['state_dict'], message_hub={'loss': buffer})
    old = tmp_path / 'numpy1.pth'
    old.write_bytes(numpy1_bytes(payload))
    res = run([TEST, SEG, old, '--work-dir', tmp_path / 'w'], shapes_dir)
    assert res.returncode == 0 and 'mIoU: ' in res.stdout + res.stderr, res.stdout[-3000:] + res.stderr[-3000:]


def test_an_engine_cache_hit_says_loaded_not_saved(checkpoint, tmp_path, monkeypatch, capsys):
    """The [engine] line names what was written as saved and what was read back as loaded: the fused engine's
    int8 ranges, calibrated on a folder, are saved by the first run and loaded by the second."""
    from cpvt_backbones.adapters.engines import config_request, engine_model
    from cpvt_backbones.adapters.runner import read_config
    from cpvt_backbones.deploy.kernels import KERNELS, unavailable_reason
    if not KERNELS['onednn_int8'].available():
        pytest.skip(f"the fused engine's int8: {unavailable_reason('onednn_int8')}")
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(tmp_path / 'cache'))
    for i in range(2):
        save_image(tmp_path / 'calib' / f'{i}.png', 40, 30)
    cfg = read_config(str(SEG))
    lines = []
    for _ in range(2):
        engine_model(shapes_model(SEG.name), cfg, str(checkpoint(SEG)),
                     config_request(cfg, 'fused', 'int8', str(tmp_path / 'calib'), 2))
        lines.append([x for x in capsys.readouterr().out.splitlines() if x.startswith('[engine] ')][-1])
    first, second = lines
    assert '; saved: ' in first and 'loaded' not in first and '.ranges.json' in first, first
    assert '; loaded: ' in second and 'saved' not in second and '.ranges.json' in second, second


EVAL_SIZES, EXPORT = ROOT / 'tools/eval_sizes.py', ROOT / 'tools/export_onnx.py'
CONVERT = ROOT / 'tools/convert_checkpoint.py'


def nan_checkpoint(cfg, folder):
    """The config's model with random weights and one NaN weight of the backbone, as an mmengine checkpoint."""
    state = shapes_model(cfg.name).state_dict()
    state['backbone.blocks.1.0.mlp.fc1.weight'][0, 0] = float('nan')
    path = folder / f'nan_{cfg.stem}.pth'
    torch.save({'state_dict': state, 'meta': {}}, path)
    return path


def test_eval_sizes_refuses_a_checkpoint_that_does_not_fit_and_writes_nothing(checkpoint, shapes_dir, tmp_path):
    """tools/eval_sizes.py loads as tools/test.py does (``adapters.evaluation.evaluate``, strictly): the detector's
    checkpoint for the segmentor's config, and the segmentor's own with a NaN weight, are each refused in one line
    naming the checkpoint (and the key that is not finite), nothing evaluated and no table written; with
    --allow-nonfinite the NaN checkpoint is evaluated."""
    from cpvt_backbones.convert.loading import compare
    wrong, nan, out = checkpoint(DET), nan_checkpoint(SEG, tmp_path), tmp_path / 'out'
    line = one_line(run([EVAL_SIZES, SEG, wrong, '--sizes', '64', '--out', out], shapes_dir), 'eval_sizes.py')
    assert f'checkpoint {wrong} (config {SEG}) does not fit the model' in line, line
    report = compare(shapes_model(SEG.name), safe_load(wrong)['state_dict'])
    assert report and report.unexpected[0] in line, line
    line = one_line(run([EVAL_SIZES, SEG, nan, '--sizes', '64', '--out', out], shapes_dir), 'eval_sizes.py')
    assert f'checkpoint {nan}' in line and 'backbone.blocks.1.0.mlp.fc1.weight' in line, line
    assert not out.exists() or not list(out.glob('*.csv'))
    res = run([EVAL_SIZES, SEG, nan, '--sizes', '64', '--out', out, '--allow-nonfinite'], shapes_dir)
    assert res.returncode == 0 and (out / f'{SEG.stem}.csv').is_file(), res.stdout[-3000:] + res.stderr[-3000:]


def test_evaluate_refuses_a_checkpoint_that_does_not_fit(checkpoint, shapes_dir, monkeypatch):
    """``adapters.evaluation.evaluate`` (the demo's and the benchmarks' evaluation) refuses another model's
    checkpoint before its test loop runs."""
    from cpvt_backbones.adapters.evaluation import evaluate
    from cpvt_backbones.adapters.runner import load_config
    from cpvt_backbones.convert import CheckpointMismatchError
    monkeypatch.chdir(shapes_dir)
    with pytest.raises(CheckpointMismatchError, match=f'^checkpoint {re.escape(str(checkpoint(DET)))} .*does not fit'):
        evaluate(load_config(str(SEG)), str(checkpoint(DET)), str(shapes_dir / 'evaluate'), 'wrong')


def test_calibrate_refuses_a_checkpoint_that_does_not_fit(checkpoint, shapes_dir, monkeypatch):
    """``adapters.engines.calibrate`` (the fused engine's ranges for ``--input-ranges``) loads through the same strict
    route: another model's checkpoint is refused before anything is calibrated."""
    from cpvt_backbones.adapters.engines import calibrate
    from cpvt_backbones.adapters.runner import load_config
    from cpvt_backbones.convert import CheckpointMismatchError
    monkeypatch.chdir(shapes_dir)
    monkeypatch.setenv('CPVT_WEIGHTS_DIR', str(shapes_dir / 'weights'))
    with pytest.raises(CheckpointMismatchError, match=f'^checkpoint {re.escape(str(checkpoint(DET)))} .*does not fit'):
        calibrate(load_config(str(SEG)), str(checkpoint(DET)), 'val', 2)


def broken_checkpoints(cfg, checkpoint, folder):
    """An empty file and the config's checkpoint cut to half its length, each with what the one line must say."""
    empty, cut = folder / 'empty.pth', folder / 'cut.pth'
    empty.write_bytes(b'')
    whole = checkpoint(cfg).read_bytes()
    cut.write_bytes(whole[:len(whole) // 2])
    return [(empty, 'it is empty'), (cut, 'damaged or truncated zip')]


@pytest.mark.parametrize('tool', ['test.py', 'infer.py', 'eval_sizes.py', 'export_onnx.py'])
def test_an_empty_or_truncated_checkpoint_is_named_in_one_line(tool, checkpoint, shapes_dir, tmp_path):
    """Each tool that reads an mmengine checkpoint names an empty file and a truncated one in one line (exit status
    1, no traceback), and writes nothing."""
    save_image(tmp_path / 'images' / 'x.png', 40, 30)
    for path, problem in broken_checkpoints(SEG, checkpoint, tmp_path):
        args = {'test.py': [TEST, SEG, path, '--work-dir', tmp_path / 'w'],
                'infer.py': [INFER, SEG, path, tmp_path / 'images', '--out-dir', tmp_path / 'out'],
                'eval_sizes.py': [EVAL_SIZES, SEG, path, '--sizes', '64', '--out', tmp_path / 'out'],
                'export_onnx.py': [EXPORT, SEG, tmp_path / 'out' / 'x.onnx', '--checkpoint', path]}[tool]
        line = one_line(run(args, shapes_dir), tool)
        assert f'{path} is not a readable weight file' in line and problem in line, line
        written = [p for pattern in ('out/*.*', 'out/vis/*', 'out/preds/*') for p in tmp_path.glob(pattern)]
        assert not written, written


def test_mmengine_names_an_empty_or_truncated_checkpoint(checkpoint, tmp_path):
    """In process: mmengine's checkpoint reader, under the checkpoint opt-in, raises ``WeightFileError`` naming an
    empty or truncated file and what is wrong with it."""
    from mmengine.runner.checkpoint import _load_checkpoint

    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (the opt-in)
    from cpvt_backbones.convert.io import WeightFileError
    for path, problem in broken_checkpoints(SEG, checkpoint, tmp_path):
        with pytest.raises(WeightFileError, match=f'^{path} is not a readable weight file .*{problem}'):
            _load_checkpoint(str(path), map_location='cpu')


def test_export_onnx_refuses_a_checkpoint_of_another_model_in_one_line(checkpoint, tmp_path):
    """A detector's checkpoint given a backbone's name, and a detector's checkpoint given a segmentor's config:
    one line naming the checkpoint (exit status 1), nothing written."""
    wrong, out = checkpoint(DET), tmp_path / 'x.onnx'
    line = one_line(run([EXPORT, 'pcpvt_tiny', out, '--checkpoint', wrong], tmp_path), 'export_onnx.py')
    assert str(wrong) in line, line
    line = one_line(run([EXPORT, SEG, out, '--checkpoint', wrong], tmp_path), 'export_onnx.py')
    assert f'checkpoint {wrong} (config {SEG}) does not fit the model' in line, line
    assert not out.exists()


def test_convert_checkpoint_names_weights_a_layout_cannot_hold(tmp_path):
    """A PVTv2 checkpoint ``--to mmseg`` (whose layout has PCPVT and SVT backbones only): one line naming the file
    and its family, nothing written."""
    from cpvt_backbones import create_model
    src, dst = tmp_path / 'pvt.pth', tmp_path / 'out.pth'
    torch.save(create_model('pvt_v2_b0').state_dict(), src)
    line = one_line(run([CONVERT, src, dst, '--to', 'mmseg'], tmp_path), 'convert_checkpoint.py')
    assert f'{src} is a PVTv2 checkpoint, which the mmseg layout cannot hold' in line, line
    assert not dst.exists()


def test_eval_sizes_refuses_a_size_below_one_pixel(tmp_path):
    res = run([EVAL_SIZES, SEG, tmp_path / 'unused.pth', '--sizes', '64', '0'], tmp_path)
    assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr[-3000:]
    assert "argument --sizes: a test size must be at least 1 pixel, got 0" in res.stderr, res.stderr[-3000:]


# A tool run whose writer is killed (SIGKILL) halfway through its file, as a tool killed while it saves: the writer
# named by $DIE_IN ('onnx': cpvt_backbones.deploy.onnx.export; 'torch': torch.save) writes half a file to the path
# or file it is given, then the process kills itself.
KILLED_WRITE = """
import os, runpy, signal, sys
import torch


def half_then_die(target):
    f = open(target, 'wb') if isinstance(target, (str, os.PathLike)) else target
    f.write(b'PK\\x03\\x04 half a file')
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)


if os.environ['DIE_IN'] == 'onnx':
    import cpvt_backbones.deploy.onnx as onnx
    onnx.export = lambda model, path, names, *args, **kwargs: half_then_die(path)
else:
    torch.save = lambda obj, f, *args, **kwargs: half_then_die(f)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize('tool', ['export_onnx.py', 'convert_checkpoint.py'])
def test_a_tool_killed_while_writing_leaves_nothing_under_the_final_name(tool, tmp_path):
    """export_onnx.py and convert_checkpoint.py killed halfway through writing their output: no file under the
    output's name (the half-written one is a hidden temporary file beside it); a file there before is kept as it
    was."""
    from cpvt_backbones import create_model
    (tmp_path / 'killed.py').write_text(KILLED_WRITE)
    src = tmp_path / 'w.pth'
    torch.save(create_model('pcpvt_tiny', num_classes=0).state_dict(), src)
    out = tmp_path / 'out' / ('x.onnx' if tool == 'export_onnx.py' else 'x.pth')
    args = [EXPORT, 'pcpvt_tiny', out] if tool == 'export_onnx.py' else [CONVERT, src, out]
    for before in (None, b'the earlier file'):
        if before is not None:
            out.write_bytes(before)
        res = run([tmp_path / 'killed.py', *args], tmp_path,
                  {'DIE_IN': 'onnx' if tool == 'export_onnx.py' else 'torch'})
        assert res.returncode == -9, res.stdout[-3000:] + res.stderr[-3000:]
        if before is None:
            assert not out.exists()
            assert [p.name.startswith(f'.{out.name}.') for p in out.parent.iterdir()] == [True]
        else:
            assert out.read_bytes() == before


def test_eval_sizes_writes_its_results_whole_or_not_at_all(tmp_path, monkeypatch):
    """The plot's writer failing halfway: the table and the JSON are written whole, no plot under its name and no
    temporary file left."""
    import importlib.util

    from matplotlib.figure import Figure

    from cpvt_backbones.adapters.evaluation import METRICS
    spec = importlib.util.spec_from_file_location('eval_sizes_tool', EVAL_SIZES)
    eval_sizes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_sizes)

    def half_then_fail(self, path, *args, **kwargs):
        Path(path).write_bytes(b'\x89PNG half a file')
        raise OSError(28, 'No space left on device (simulated)')

    monkeypatch.setattr(Figure, 'savefig', half_then_fail)
    rows, out = [dict(size=64, metric=50.0), dict(size=96, metric=52.5)], tmp_path / 'out'
    with pytest.raises(OSError, match='simulated'):
        eval_sizes.write(rows, METRICS['mmseg'], out, 'x')
    assert sorted(p.name for p in out.iterdir()) == ['x.csv', 'x.json']
    assert (out / 'x.csv').read_text().splitlines() == ['size,metric', '64,50.0', '96,52.5']
    assert json.loads((out / 'x.json').read_text())['rows'] == rows


# tools/infer.py with every drawing counted: the visualisers' add_datasample calls, written as JSON to $DRAWS_FILE
# when the tool ends.
COUNTING_DRAWS = recording("""
from mmdet.visualization import DetLocalVisualizer
from mmseg.visualization import SegLocalVisualizer
for cls in (DetLocalVisualizer, SegLocalVisualizer):
    def counted(self, *args, _draw=cls.add_datasample, **kwargs):
        seen.append(type(self).__name__)
        return _draw(self, *args, **kwargs)
    cls.add_datasample = counted
""", 'DRAWS_FILE')


@pytest.mark.parametrize('cfg', CONFIGS)
def test_infer_no_draw_writes_the_predictions_and_draws_nothing(cfg, checkpoint, tmp_path):
    """--no-draw: every image's prediction is written, no image is drawn (the visualiser is never called) and
    vis/ holds nothing; without it each image is drawn once."""
    for i, (w, h) in enumerate([(40, 30), (23, 57)]):
        save_image(tmp_path / 'images' / f'{i}.png', w, h)
    (tmp_path / 'counting.py').write_text(COUNTING_DRAWS)
    pred = '.json' if cfg == DET else '.png'
    for flag, drawn in (('--no-draw', 0), (None, 2)):
        out = tmp_path / f'out{drawn}'
        res = run([tmp_path / 'counting.py', INFER, cfg, checkpoint(cfg), tmp_path / 'images', '--out-dir', out,
                   *([flag] if flag else [])], tmp_path, {'DRAWS_FILE': str(tmp_path / f'draws{drawn}.json')})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert len(json.loads((tmp_path / f'draws{drawn}.json').read_text())) == drawn
        assert sorted(outputs(out, 'preds')) == [f'0{pred}', f'1{pred}']
        assert len(outputs(out, 'vis')) == drawn
