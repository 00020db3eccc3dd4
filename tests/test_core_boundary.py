"""The core (package root, layers, models, convert) must import nothing from OpenMMLab."""
import ast
import subprocess
import sys
from pathlib import Path

import cpvt_backbones

PKG = Path(cpvt_backbones.__file__).parent
FORBIDDEN = ('mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain')
CORE = [PKG / '__init__.py'] + [p for sub in ('layers', 'models', 'convert') for p in (PKG / sub).rglob('*.py')]


def _imported_roots(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name.split('.')[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split('.')[0]


def test_core_sources_import_no_openmmlab():
    assert len(CORE) > 8
    bad = {str(p.relative_to(PKG)): r for p in CORE for r in _imported_roots(p) if r in FORBIDDEN}
    assert not bad


def test_core_runs_with_openmmlab_blocked():
    """Import and run the core in a fresh interpreter where every OpenMMLab import fails."""
    code = f'''
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {FORBIDDEN!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import torch, cpvt_backbones
from cpvt_backbones import convert, layers, models
m = cpvt_backbones.create_model('pcpvt_tiny', features_only=True)
assert len(m(torch.randn(1, 3, 35, 41))) == 4
assert not [k for k in sys.modules if k.split('.')[0] in {FORBIDDEN!r}]
'''
    subprocess.run([sys.executable, '-c', code], check=True)


def test_adapters_are_outside_the_core():
    adapters = {p.stem for p in (PKG / 'adapters').glob('*.py')}
    assert {'mmdet', 'mmseg', 'mmpretrain'} <= adapters
