"""Packaging: installing the package into an environment that has its stack already moves nothing (every
requirement of the package and of the extra that names this environment's OpenMMLab packages is met by what is
installed, torch 2.1 on the core and upstream stacks, so pip has nothing to install, upgrade or downgrade), and
nothing in the repository's Python needs a newer Python than ``requires-python`` names (vermin's static check;
ruff checks the syntax at the same version)."""
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

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
