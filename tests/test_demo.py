"""tools/demo.py: its trainings give the same weights whatever thread count the shell asks for (the demo sets its
own), and its summary names the code's commit."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _demo():
    """tools/demo.py as a module (it needs the OpenMMLab stack)."""
    import importlib.util
    for framework in ('mmengine', 'mmdet', 'mmseg', 'mmpretrain'):
        pytest.importorskip(framework)
    spec = importlib.util.spec_from_file_location('demo', ROOT / 'tools' / 'demo.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_in_a_fresh_shell(cwd: Path, config: Path, out: Path, omp_threads: str) -> str:
    """``demo.train`` of ``config`` into ``out`` in a new interpreter whose environment asks for ``omp_threads``
    OpenMP threads; returns the final checkpoint's path."""
    code = (f'import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tools")!r}]\n'
            'import demo\n'
            f'checkpoint, trained = demo.train("pretraining", {str(config)!r}, demo.Path({str(out)!r}), True)\n'
            'assert trained\n'
            'print(checkpoint)\n')
    env = dict(os.environ, OMP_NUM_THREADS=omp_threads, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, '-c', code], cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout.split()[-1]


@pytest.mark.heavy
def test_a_training_gives_the_same_weights_whatever_the_shells_thread_count(tmp_path):
    """The demo's pretraining config (three iterations on 32 crops) trained twice, from shells with
    OMP_NUM_THREADS=1 and 2: bitwise the same weights, since the demo runs torch on a thread count of its own
    (another thread count sums in another order, and training carries the rounding on)."""
    for framework in ('mmengine', 'mmpretrain'):
        pytest.importorskip(framework)
    import torch

    import cpvt_backbones.adapters.checkpoint  # noqa: F401  (mmengine's log buffers load safely)
    from cpvt_backbones.convert import safe_load
    from cpvt_backbones.datasets import generate_shape_crops
    generate_shape_crops(tmp_path / 'data' / 'shapes_cls', num_train=32, num_val=8)
    config = tmp_path / 'pretraining_short.py'
    config.write_text(f"""_base_ = '{ROOT / 'configs/shapes/pcpvt-tiny_shapes-cls.py'}'
max_iters = 3
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
train_dataloader = dict(batch_size=16)
param_scheduler = [dict(type='LinearLR', start_factor=1.0, by_epoch=False, begin=0, end=max_iters)]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=max_iters))
""")
    weights = []
    for threads in ('1', '2'):
        path = _train_in_a_fresh_shell(tmp_path, config, tmp_path / f'omp{threads}', threads)
        weights.append(safe_load(path)['state_dict'])
    assert weights[0].keys() == weights[1].keys()
    differ = [k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k])]
    assert not differ, f'{len(differ)} of {len(weights[0])} tensors differ, e.g. {differ[:3]}'


def test_the_summary_names_the_commit_of_the_code():
    """``code_commit``: the checkout's HEAD, and whether its tracked files differ from it."""
    head = subprocess.run(['git', '-C', str(ROOT), 'rev-parse', 'HEAD'], capture_output=True, text=True)
    if head.returncode:
        pytest.skip('not a git checkout')
    status = subprocess.run(['git', '-C', str(ROOT), 'status', '--porcelain', '--untracked-files=no'],
                            capture_output=True, text=True, check=True).stdout
    assert _demo().code_commit() == dict(commit=head.stdout.strip(), dirty=bool(status.strip()))
