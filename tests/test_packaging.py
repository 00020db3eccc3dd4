"""Installing the package into an environment that has its stack already moves nothing: every requirement of the
package and of the extra that names this environment's OpenMMLab packages is met by what is installed (torch 2.1
on the core and upstream stacks), so pip has nothing to install, upgrade or downgrade."""
import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']


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
