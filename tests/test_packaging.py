"""Packaging: installing the package into an environment that has its stack already moves nothing (every
requirement of the package and of the extra that names this environment's OpenMMLab packages is met by what is
installed, torch 2.1 on the core and upstream stacks, so pip has nothing to install, upgrade or downgrade), and
nothing in the repository's Python needs a newer Python than ``requires-python`` names (vermin's static check;
ruff checks the syntax at the same version), and the built wheel works where only its declared requirements are:
installed with ``--no-deps`` into an empty virtual environment that has them (linked from this one) and nothing
else, no numpy and no OpenMMLab, every core module imports, the Quick start's offline lines give what README says,
and weight files in the published format load."""
import collections
import csv
import email.message
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

try:
    import tomllib  # novermin: Python 3.10 reads the file with tomli, a dependency of pytest there
except ModuleNotFoundError:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / 'pyproject.toml').read_text())
PROJECT = PYPROJECT['project']
# Every Python file of the repository: the package, the tools, the benchmarks, the tests and the configs.
SOURCES = ['cpvt_backbones', 'tools', 'benchmarks', 'tests', 'configs', 'setup.py']


def _installed(name: str):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _extras() -> list:
    """The extras whose packages this environment has: OpenMMLab's or the OneDL forks', and OpenVINO's."""
    extras = ['onedl' if _installed('onedl-mmengine') else 'openmmlab' if _installed('mmengine') else None,
              'openvino' if _installed('openvino') else None]
    return [e for e in extras if e]


def test_installing_the_package_moves_nothing_installed():
    requirements = [Requirement(r) for r in PROJECT['dependencies']]
    for extra in _extras():
        requirements += [Requirement(r) for r in PROJECT['optional-dependencies'][extra]]
    unmet = {str(r): _installed(r.name) for r in requirements
             if _installed(r.name) is None or not r.specifier.contains(_installed(r.name), prereleases=True)}
    assert not unmet, f'pip would install or change these (requirement: installed version): {unmet}'
    assert Requirement(PROJECT['dependencies'][0]).specifier.contains('2.1.2')  # the oldest supported torch


def _oldest_python() -> str:
    """The oldest Python ``requires-python`` admits, as ``'3.10'``."""
    (spec,) = SpecifierSet(PROJECT['requires-python'])
    assert spec.operator == '>=', f'requires-python should be a lower bound, got {spec}'
    return spec.version


def _vermin(*paths: str) -> str:
    """What vermin finds in ``paths`` that the oldest supported Python cannot run, one file and its reasons per
    entry ('' when nothing): names and syntax that need a newer release, and files this Python cannot parse
    (``--pessimistic``). Annotations count as evaluated (Python 3.10 evaluates them when a function is defined)."""
    pytest.importorskip('vermin', reason='the minimum-Python check needs vermin (tools/setup_env.sh installs it)')
    command = [sys.executable, '-c', 'from vermin import main; main()', f'--target={_oldest_python()}-',
               '--violations', '--quiet', '--no-tips', '--pessimistic', '--eval-annotations', '--no-config-file',
               '--processes=1', *paths]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    found = result.stdout.strip()
    assert result.returncode in (0, 1) and (result.returncode == 0 or found), result.stdout + result.stderr
    return found


def test_nothing_needs_a_newer_python_than_requires_python():
    assert _oldest_python() == '3.10'
    found = _vermin(*SOURCES)
    assert not found, f'code that Python {_oldest_python()} cannot run (vermin):\n{found}'


def test_the_minimum_version_check_finds_newer_python(tmp_path):
    # What the check above relies on: with these options vermin reports a 3.11 module and name, and syntax that
    # 3.10 lacks (reported as 3.11's where this Python parses it, as unparsable where it does not).
    (tmp_path / 'names.py').write_text('import tomllib\nfrom typing import Self\n')
    (tmp_path / 'syntax.py').write_text('try:\n    pass\nexcept* ValueError:\n    pass\n')
    found = _vermin(str(tmp_path / 'names.py'))
    assert "'tomllib' module requires !2, 3.11" in found and "'typing.Self' member requires !2, 3.11" in found
    found = _vermin(str(tmp_path / 'syntax.py'))
    assert 'syntax.py' in found and 'except*' in found


def test_ruff_checks_at_the_oldest_supported_python():
    assert PYPROJECT['tool']['ruff']['target-version'] == 'py' + _oldest_python().replace('.', '')


# The bare install: the package's wheel, built from this checkout, installed with --no-deps into a virtual
# environment that holds nothing but the distributions its declared requirements need (torch, safetensors and what
# they declare, torch's CUDA libraries included, no numpy), linked from this environment rather than installed
# again.
# A Quick start line that needs more than that says so in its comment with one of these.
QUICK_START_NEEDS = ('[network]', 'pip install')
# The modules that need only the declared requirements (the package docstring): the package root, these modules and
# every module of these subpackages. adapters and datasets need the frameworks and packages they are named after.
CORE = ('cpvt_backbones.compat', 'cpvt_backbones.utils', 'cpvt_backbones.layers',
        'cpvt_backbones.models', 'cpvt_backbones.convert', 'cpvt_backbones.deploy')
# One worker builds the bare install once for all its tests.
BARE = pytest.mark.xdist_group('bare_install')
# Packages that the core does not need and the bare install must not have.
ABSENT = ('numpy', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'openvino', 'onnxruntime', 'timm', 'PIL')


def _closure(requirements: list) -> dict:
    """The installed distributions (by normalised name) that ``requirements`` need, theirs included, as pip reads
    them for this interpreter: each requirement's marker (with the extras asked of its distribution) and extras."""
    found, extras, todo = {}, {}, [(r, ('',)) for r in requirements]
    while todo:
        requirement, parent_extras = todo.pop()
        if requirement.marker is not None and not any(requirement.marker.evaluate({'extra': e})
                                                      for e in parent_extras):
            continue
        name = canonicalize_name(requirement.name)
        if name in found and set(requirement.extras) <= extras[name]:
            continue
        try:
            found[name] = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f'this environment lacks {requirement}, which the bare install needs: install it (make env)')
        extras[name] = extras.get(name, set()) | set(requirement.extras)
        todo += [(Requirement(r), ('', *sorted(extras[name]))) for r in found[name].requires or []]
    return found


def _entries(dist) -> set:
    """The top-level names in its site directory that ``dist`` installed (its RECORD's first path parts)."""
    rows = csv.reader((dist.read_text('RECORD') or '').splitlines())
    return {row[0].split('/', 1)[0] for row in rows if row and not row[0].startswith(('..', '/'))} - {'__pycache__'}


def _expose(dists: dict, site: Path) -> None:
    """Link into ``site`` everything ``dists`` installed: a top-level folder or file as a whole where no other
    installed distribution put files in it, else file by file (a namespace folder that others share)."""
    owners = collections.defaultdict(set)
    for dist in importlib.metadata.distributions():
        base = Path(dist.locate_file(''))
        for entry in _entries(dist):
            owners[base / entry].add(canonicalize_name(dist.metadata['Name']))
    for dist in dists.values():
        base = Path(dist.locate_file(''))
        for entry in _entries(dist):
            if owners[base / entry] <= set(dists):
                if not (site / entry).exists():
                    (site / entry).symlink_to(base / entry)
                continue
            for file in dist.files:
                if file.parts[0] == entry and '__pycache__' not in file.parts and not (site / file).exists():
                    (site / file).parent.mkdir(parents=True, exist_ok=True)
                    (site / file).symlink_to(base / file)


def _wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith('.dist-info/METADATA')]
        return email.message_from_bytes(archive.read(name))


@pytest.fixture(scope='module')
def bare_install(tmp_path_factory):
    """The package's wheel installed beside its declared requirements' closure and nothing else: the folder, the
    interpreter, its site directory, the wheel and the distributions linked in."""
    root = tmp_path_factory.mktemp('bare')
    source = root / 'source'
    shutil.copytree(ROOT / 'cpvt_backbones', source / 'cpvt_backbones',
                    ignore=shutil.ignore_patterns('__pycache__'))
    for name in ('pyproject.toml', 'setup.py', 'README.md'):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', '--no-index',
                    '-w', str(root / 'dist'), str(source)], check=True, capture_output=True)
    (wheel,) = (root / 'dist').glob('cpvt_backbones-*.whl')
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(root / 'env')], check=True)
    python = root / 'env' / 'bin' / 'python'
    site = Path(subprocess.run([str(python), '-I', '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
                               capture_output=True, text=True, check=True).stdout.strip())
    dists = _closure([Requirement(r) for r in _wheel_metadata(wheel).get_all('Requires-Dist') or []])
    _expose(dists, site)
    subprocess.run([sys.executable, '-m', 'pip', '--python', str(python), 'install', '-q', '--no-deps',
                    '--no-index', str(wheel)], check=True, capture_output=True)
    return types.SimpleNamespace(root=root, python=python, site=site, wheel=wheel, dists=dists)


def _run_bare(env, code: str, *args: str) -> dict:
    """Run ``code`` in the bare install's interpreter, isolated (no PYTHONPATH, no user site, not from the
    repository) and offline (every HTTP(S) request goes to a closed port); the JSON it prints last."""
    offline = 'http://127.0.0.1:9'
    variables = {**os.environ, 'http_proxy': offline, 'https_proxy': offline, 'HTTP_PROXY': offline,
                 'HTTPS_PROXY': offline, 'no_proxy': '', 'NO_PROXY': '', 'TORCH_HOME': str(env.root / 'torch_home'),
                 'CPVT_WEIGHTS_DIR': str(env.root / 'weights')}
    result = subprocess.run([str(env.python), '-I', '-c', code, *args], cwd=env.root, env=variables,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f'in the bare install:\n{result.stdout[-3000:]}{result.stderr[-6000:]}'
    return json.loads(result.stdout.strip().splitlines()[-1])


@BARE
def test_the_bare_install_has_the_declared_requirements_and_nothing_else(bare_install):
    installed = {canonicalize_name(d.metadata['Name']): d
                 for d in importlib.metadata.distributions(path=[str(bare_install.site)])}
    package = installed.pop('cpvt-backbones')
    assert package.version == PROJECT['version'] and set(installed) == set(bare_install.dists)
    declared = [Requirement(r) for r in package.requires or []]
    assert {canonicalize_name(r.name) for r in declared if r.marker is None} == \
        {canonicalize_name(Requirement(r).name) for r in PROJECT['dependencies']}
    unmet = [str(r) for r in declared if (r.marker is None or r.marker.evaluate({'extra': ''})) and not
             r.specifier.contains(installed[canonicalize_name(r.name)].version, prereleases=True)]
    assert not unmet, f'declared but not met in the bare install: {unmet}'
    assert 'numpy' not in installed and 'torch' in installed
    found = _run_bare(bare_install, '''
import importlib, json, sys
import torch, cpvt_backbones
absent = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        absent[name] = e.name
print(json.dumps(dict(absent=absent, package=cpvt_backbones.__file__, torch=torch.__file__,
                      product=(torch.ones(2, 3) @ torch.ones(3, 2)).sum().item())))
''', *ABSENT)
    assert found['absent'] == {name: name for name in ABSENT}, 'importable in the bare install'
    assert Path(found['package']).is_relative_to(bare_install.site), found['package']
    assert Path(found['torch']).is_relative_to(bare_install.site) and found['product'] == 12., found


@BARE
def test_every_core_module_imports_in_the_bare_install(bare_install):
    found = _run_bare(bare_install, '''
import importlib, json, sys, traceback
from pathlib import Path
import torch
site, core = Path(sys.argv[1]), sys.argv[2:]
names = sorted('.'.join(p.relative_to(site).with_suffix('').parts).removesuffix('.__init__')
               for p in (site / 'cpvt_backbones').rglob('*.py'))
names = [n for n in names if n == 'cpvt_backbones' or any(n == c or n.startswith(c + '.') for c in core)]
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        inside = [f for f in traceback.extract_tb(e.__traceback__) if '/cpvt_backbones/' in f.filename]
        where = f' at {Path(inside[-1].filename).relative_to(site)}:{inside[-1].lineno}' if inside else ''
        failed[name] = f'{type(e).__name__}: {e}{where}'
print(json.dumps(dict(names=names, failed=failed)))
''', str(bare_install.site), *CORE)
    assert not found['failed'], f'core modules that do not import beside the declared requirements: {found["failed"]}'
    assert len(found['names']) > 40 and 'cpvt_backbones.deploy.engines.openvino' in found['names']


def _quick_start() -> tuple[list[str], list[str]]:
    """The Quick start's lines: those that need nothing beyond the bare install, and those whose comments name a
    ``pip install`` (and no ``[network]``)."""
    block = re.search(r'^## Quick start\n+```python\n(.*?)^```', (ROOT / 'README.md').read_text(), re.M | re.S)
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    offline = [line for line in lines if not any(need in line.partition('#')[2] for need in QUICK_START_NEEDS)]
    installs = [line for line in lines if 'pip install' in line.partition('#')[2]
                and '[network]' not in line.partition('#')[2]]
    return offline, installs


@BARE
def test_the_quick_start_runs_offline_in_the_bare_install(bare_install):
    """The offline lines run and give what their comments say; each line that names a ``pip install`` is refused
    there with an ImportError, one that prepares an engine naming that same command."""
    offline, installs = _quick_start()
    (maps_line,) = [line for line in offline if line.startswith('maps = ')]
    stated = [tuple(map(int, size)) for size in re.findall(r'(\d+)x(\d+)', maps_line.partition('#')[2])]
    found = _run_bare(bare_install, '''
import json, sys
exec(compile(sys.argv[1], 'README.md, Quick start', 'exec'))
x = torch.randn(1, 3, 97, 131)
with torch.no_grad():
    reference = create_model('pcpvt_tiny').eval()
    reference.load_state_dict(fast.state_dict())
    fused = (fast(x) - reference(x)).abs().max().item()
    logits = list(clf(x).shape)
refused = {}
for line in json.loads(sys.argv[2]):
    try:
        exec(line)
        refused[line] = None
    except Exception as e:
        refused[line] = [type(e).__name__, str(e)]
print(json.dumps(dict(maps=[list(m.shape) for m in maps], strides=list(backbone.strides), logits=logits,
                      fused=fused, refused=refused)))
''', '\n'.join(offline), json.dumps(installs))
    assert [tuple(m[2:]) for m in found['maps']] == stated, 'the feature-map sizes README states'
    assert [m[2:] for m in found['maps']] == [[-(-513 // s), -(-769 // s)] for s in found['strides']]
    assert [m[1] for m in found['maps']] == [64, 128, 320, 512] and found['logits'] == [1, 1000]
    assert found['fused'] < 1e-5, 'the fused engine gives the model\'s outputs (README: within 1e-5)'
    assert len(installs) >= 3 and any('openvino' in line for line in installs)
    for line, refusal in found['refused'].items():
        command = 'pip install' + line.partition('#')[2].partition('pip install')[2]
        assert refusal is not None and refusal[0] in ('ImportError', 'ModuleNotFoundError'), (line, refusal)
        assert 'prepare(' not in line or command in refusal[1], (line, command, refusal)


@BARE
def test_the_fused_engine_calibrates_int8_in_the_bare_install(bare_install):
    """The fused engine needs nothing beyond torch (``deploy``), int8 with calibration included (where this
    torch has the int8 kernel)."""
    from cpvt_backbones.deploy.kernels import KERNELS, unavailable_reason
    if not KERNELS['onednn_int8'].available():
        pytest.skip(f"the fused engine's int8: {unavailable_reason('onednn_int8')}")
    found = _run_bare(bare_install, '''
import json
import torch
from cpvt_backbones import create_model
from cpvt_backbones.deploy import prepare
torch.manual_seed(0)
model = create_model('pcpvt_tiny').eval()
batches = [torch.randn(2, 3, 64, 64) for _ in range(2)]
x = torch.randn(1, 3, 64, 80)
with torch.no_grad():
    expected = model(x)
    fast = prepare(model, 'fused', 'int8', calibration=batches)
    got = fast(x)
print(json.dumps(dict(shape=list(got.shape), finite=bool(got.isfinite().all()),
                      diff=(got - expected).abs().max().item(), scale=expected.abs().max().item())))
''')
    assert found['shape'] == [1, 1000] and found['finite'], found
    assert found['diff'] < 0.2 * found['scale'], found  # int8 on this random model: 0.04 of the scale


@BARE
def test_published_weights_files_load_in_the_bare_install(bare_install):
    """``pretrained=`` a safetensors file (the layout of timm's hub files, the first source ``pretrained=True``
    tries) loads there: what reads it is declared."""
    from safetensors.torch import save_file

    from cpvt_backbones import create_model
    state = create_model('pcpvt_tiny').state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, bare_install.root / 'weights.safetensors')
    torch.save(state, bare_install.root / 'weights.pt')
    found = _run_bare(bare_install, '''
import json, sys
import torch
from cpvt_backbones import create_model
model = create_model('pcpvt_tiny', pretrained=sys.argv[1])
expected = torch.load(sys.argv[2])
state = model.state_dict()
print(json.dumps(dict(keys=sorted(state) == sorted(expected),
                      diff=max((state[k] - expected[k]).abs().max().item() for k in expected))))
''', str(bare_install.root / 'weights.safetensors'), str(bare_install.root / 'weights.pt'))
    assert found == dict(keys=True, diff=0.)
