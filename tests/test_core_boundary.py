"""The core (package root, layers, models, convert, deploy) must import nothing from OpenMMLab; the optional
inference engines (openvino, nncf, onnxruntime) load only when used."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import cpvt_backbones

PKG = Path(cpvt_backbones.__file__).parent
FORBIDDEN = ('mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain')
CORE = [PKG / '__init__.py', PKG / 'compat.py'] + [p for sub in ('layers', 'models', 'convert', 'deploy')
                                for p in (PKG / sub).rglob('*.py')]


def _imported_roots(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name.split('.')[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split('.')[0]


def _require_openmmlab():
    for name in ('mmengine', 'mmdet', 'mmseg', 'mmpretrain'):
        pytest.importorskip(name)


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
from cpvt_backbones import convert, deploy, layers, models
m = cpvt_backbones.create_model('pcpvt_tiny', features_only=True)
assert len(m(torch.randn(1, 3, 35, 41))) == 4
assert not [k for k in sys.modules if k.split('.')[0] in {FORBIDDEN!r}]
assert not [k for k in sys.modules if k.split('.')[0] in ('openvino', 'nncf', 'onnxruntime')]
'''
    subprocess.run([sys.executable, '-c', code], check=True)


def test_adapters_are_outside_the_core():
    adapters = {p.stem for p in (PKG / 'adapters').glob('*.py')}
    assert {'mmdet', 'mmseg', 'mmpretrain'} <= adapters


def test_importing_an_adapter_only_registers_the_backbones():
    """Nothing but the registries' new entries (the backbones, and mmdet's and mmseg's valid-size data
    preprocessors) changes: file backends, the safe loader's allowed globals, mmengine's
    checkpoint loaders, pickling rules, hooks and every other registry are as they were. The checkpoint and hook
    opt-ins do change them (torch's own allow-list never)."""
    _require_openmmlab()
    code = '''
import copyreg, importlib, sys
import torch
from mmengine.fileio.backends import registry_utils
from mmengine.registry import HOOKS, MODELS
from mmengine.runner.checkpoint import CheckpointLoader
from cpvt_backbones.convert import io
framework = sys.argv[1]
importlib.import_module(framework + '.registry')
def state():
    return (dict(registry_utils.backends), dict(registry_utils.prefix_to_backends),
            list(io._ALLOWED), dict(copyreg.dispatch_table), sorted(HOOKS.module_dict), sorted(MODELS.module_dict),
            dict(CheckpointLoader._schemes), list(getattr(torch.serialization, 'get_safe_globals', list)()))
before = state()
registry = importlib.import_module(framework + '.registry').MODELS
known = set(registry.module_dict)
importlib.import_module('cpvt_backbones.adapters.' + framework)
assert state() == before, 'importing the adapter changed more than its registry'
preprocessor = {'mmdet': {'ValidSizeDetDataPreprocessor', 'PredictAlone'},
                'mmseg': {'ValidSizeSegDataPreprocessor', 'PredictAlone'}}.get(framework, set())
assert set(registry.module_dict) - known == {'PyramidCPVT', 'TwinsSVT', 'CPVT', 'PVTv2'} | preprocessor, \
    set(registry.module_dict) - known
import cpvt_backbones.adapters.checkpoint, cpvt_backbones.adapters.hooks
after = state()
assert after[0]['local'] is not before[0]['local'] and len(after[2]) > len(before[2]) and after[4] != before[4]
assert after[6][''] is cpvt_backbones.adapters.checkpoint.load_from_local
assert after[7] == before[7], "torch's own allow-list is left alone"
assert 'RNGStateHook' in after[4]
'''
    for framework in ('mmdet', 'mmseg', 'mmpretrain'):
        subprocess.run([sys.executable, '-c', code, framework], check=True)


def test_importing_any_module_changes_no_process_state():
    """Every module of the package (but the two opt-ins, whose purpose is a global change), every study and
    benchmark module and every tool imports without touching the process: sys.path, the umask (read from
    /proc, which does not change it), torch's FLOP-formula registry, warning filters, torch's defaults and RNG.
    The third-party libraries are imported first, so that only our own modules are judged."""
    _require_openmmlab()
    root = PKG.parent
    code = f'''
import importlib, importlib.util, pkgutil, sys, warnings
import torch, mmengine, mmdet, mmseg, mmpretrain, timm, matplotlib, numpy
import mmdet.models, mmseg.models, mmpretrain.models, mmdet.registry, mmseg.registry, mmpretrain.registry
from torch.utils import flop_counter
flop_registry = getattr(flop_counter, 'flop_registry', {{}})  # torch >= 2.2
sys.path[:0] = [{str(root)!r}, {str(root / 'tools')!r}]
def umask():
    return open('/proc/self/status').read().split('Umask:')[1].split()[0]
def state():
    return (list(sys.path), umask(), sorted(map(str, flop_registry)), [str(f) for f in warnings.filters],
            torch.get_default_dtype(), torch.get_num_threads(), torch.random.get_rng_state().sum().item(),
            matplotlib.get_backend())
before = state()
import cpvt_backbones
opt_ins = {{'cpvt_backbones.adapters.checkpoint', 'cpvt_backbones.adapters.hooks'}}
optional = {{'cpvt_backbones.adapters.hf': 'transformers'}}  # adapters of frameworks a stack may lack
names = [m.name for m in pkgutil.walk_packages(cpvt_backbones.__path__, 'cpvt_backbones.') if m.name not in opt_ins
         and importlib.util.find_spec(optional.get(m.name, 'torch')) is not None]
names += [f'benchmarks.{{m.name}}' for m in pkgutil.iter_modules([{str(root / 'benchmarks')!r}])]
names += ['export_onnx', 'visualize', 'demo', 'train', 'test', 'infer', 'eval_sizes', 'convert_checkpoint',
          'make_shapes']
for name in names:
    importlib.import_module(name)
    assert state() == before, f'importing {{name}} changed the process state'
print(len(names))
'''
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert int(res.stdout.split()[-1]) > 40


def _imports(module: str, path: Path, modules: set[str]) -> set[str]:
    """The package modules that ``module`` (at ``path``) imports anywhere (at the top, inside functions) or names as
    a module path in a string (what ``importlib.import_module`` or a config's ``custom_imports`` imports)."""
    package = module.split('.') if path.name == '__init__.py' else module.split('.')[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = '.'.join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            found |= {base, *(f'{base}.{a.name}' for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and '.' in node.value:
            found.add(node.value)
    return (found & modules) - {module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_adapters_and_the_engines_import_nothing_that_imports_them_back():
    """No chain of imports, lazy ones and module names in strings included, leads from a module of ``adapters`` or
    ``deploy`` back to itself (the runner once named the hooks module, whose engine hook imported the engine route,
    which imported the runner)."""
    root = Path(cpvt_backbones.__file__).parent
    paths = {'.'.join(p.relative_to(root.parent).with_suffix('').parts).removesuffix('.__init__'): p
             for p in root.rglob('*.py')}
    graph = {m: _imports(m, p, set(paths)) for m, p in paths.items()}
    cycles = [c for c in _cycles(graph) if any(m.startswith(('cpvt_backbones.adapters', 'cpvt_backbones.deploy'))
                                                for m in c)]
    assert not cycles, cycles
