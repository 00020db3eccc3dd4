"""A study's run records and what ties them to where they came from: a record is written whole or not at all
(``write``) and read back (``read``); a run starts on, and resumes or is tested only on, one accelerator
(``start_on``, ``trained_here``, ``one_accelerator``); ``provenance`` names the clean commit, torch and the
accelerator a record came from."""
import hashlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch

from cpvt_backbones.utils import atomic_write


def read(path: Path) -> dict | None:
    """The record at ``path``, or None where there is none yet."""
    return json.loads(path.read_text()) if path.is_file() else None


def write(path: Path, record: dict) -> dict:
    """``record`` written to ``path`` as JSON, whole or not at all (a crash leaves the file as it was); returns it."""
    atomic_write(path, json.dumps(record, indent=2).encode())
    return record


def code_version() -> str:
    """The git commit of the code running the study (with '+changes' if its tree differs), or 'unknown'."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(['git', '-C', str(root), 'rev-parse', 'HEAD'], capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(['git', '-C', str(root), 'status', '--porcelain', '--untracked-files=no'],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'
    return commit + ('+changes' if dirty else '')


STUDIED_CODE = ('benchmarks', 'cpvt_backbones')   # what a study's results depend on (its results excluded)


def source_digest(root: Path | None = None) -> str:
    """sha256 over the Python files of ``STUDIED_CODE`` (paths and contents, in path order): what the code was,
    checkable against any commit without git on the machine that ran it."""
    root = root or Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(p for d in STUDIED_CODE for p in (root / d).rglob('*.py')
                       if 'results' not in p.relative_to(root).parts):
        digest.update(path.relative_to(root).as_posix().encode() + b'\0' + path.read_bytes() + b'\0')
    return digest.hexdigest()


def accelerator(device: str) -> str:
    """The device's name: the GPU's ('NVIDIA H100 80GB HBM3'), or the CPU's model name with the vector ISA torch
    runs on it ('AMD EPYC (AVX512)'): machines of one model name differ in ISA, and so in float rounding."""
    if device.startswith('cuda'):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        names = [line.split(':', 1)[1].strip() for line in Path('/proc/cpuinfo').read_text().splitlines()
                 if line.startswith('model name')]
    except OSError:
        names = []
    name = names[0] if names else platform.processor() or platform.machine()
    return f'{name} ({torch.backends.cpu.get_cpu_capability()})'


def committed(root: Path | None = None, doing: str = 'record runs') -> tuple[str, str]:
    """The clean git commit of the tree at ``root`` (the repository by default) and where it was read ('git', or
    'CPVT_STUDY_COMMIT': without git, a bare machine given a copy of a clean checkout names it in
    ``$CPVT_STUDY_COMMIT``). Raises SystemExit, saying it refuses to ``doing``, where ``STUDIED_CODE`` (results
    excluded) has uncommitted changes, untracked files included, or where neither names a commit."""
    root = root or Path(__file__).resolve().parents[2]
    paths = [*STUDIED_CODE, ':(exclude)benchmarks/results']
    try:
        commit = subprocess.run(['git', '-C', str(root), 'rev-parse', 'HEAD'], capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(['git', '-C', str(root), 'status', '--porcelain', '--', *paths],
                               capture_output=True, text=True, check=True).stdout.strip()
        source = 'git'
    except (OSError, subprocess.CalledProcessError):
        commit, dirty, source = os.environ.get('CPVT_STUDY_COMMIT', ''), '', 'CPVT_STUDY_COMMIT'
        if not commit:
            raise SystemExit('[study] no git here to name the code\'s commit: set CPVT_STUDY_COMMIT to the commit '
                             'this copy was made from') from None
    if dirty:
        raise SystemExit(f'[study] refusing to {doing} from uncommitted code; commit or stash first:\n{dirty}')
    return commit, source


def provenance(device: str, root: Path | None = None) -> dict:
    """What a recorded run came from: the accelerator's name, torch's version, the clean git commit of the code
    (``committed``: refuses uncommitted code, a run is recorded only from committed code) and ``source_digest``;
    without git the digest is what ties the copy to the commit ``$CPVT_STUDY_COMMIT`` names."""
    root = root or Path(__file__).resolve().parents[2]
    commit, source = committed(root)
    return dict(accelerator=accelerator(device), torch=torch.__version__, commit=commit, commit_from=source,
                source_digest=source_digest(root))


def start_on(run_dir: Path, stamp: dict, tag: str, label: str,
             partial: Sequence[str] = ('checkpoint.pth', 'final.pth', 'checks')) -> None:
    """Where a run starts, or resumes: ``run_dir``/started_on.json records ``stamp`` (its ``accelerator`` and
    whatever else a study ties a run to) when the run starts. A run started on another accelerator has its
    ``partial`` training (files or folders under ``run_dir``) removed and starts again from the beginning, with a
    line (``[tag] label started on ...``) saying so: a run resumes only where it started (float rounding)."""
    started = run_dir / 'started_on.json'
    if started.is_file():
        before = json.loads(started.read_text())['accelerator']
        if before != stamp['accelerator']:
            print(f'[{tag}] {label} started on {before}, not {stamp["accelerator"]}: training it again from the '
                  'start', flush=True)
            for path in (run_dir / name for name in partial):
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            started.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not started.is_file():
        write(started, stamp)


def trained_here(record: dict, origin: dict, weights: Sequence[Path], tag: str, study: str) -> None:
    """Refuses (SystemExit) to test ``record``, a run of the study ``study``, unless it trained on this
    accelerator (``origin``'s: a comparison is tested where it trained) and every file of ``weights`` lies here
    (git keeps no weights)."""
    label = f'{record["variant"]} seed {record["seed"]} of {study}'
    if record['accelerator'] != origin['accelerator']:
        raise SystemExit(f'[{tag}] {label} trained on {record["accelerator"]}, not on {origin["accelerator"]}: a '
                         'comparison is tested where it trained')
    missing = [path.name for path in weights if not path.is_file()]
    if missing:
        raise SystemExit(f'[{tag}] {label}: the weights {missing} are not on this machine (git keeps no weights): '
                         f'train {study} here first (a run trains the same weights again from its seed)')


def one_accelerator(runs: Sequence[dict], tag: str) -> str:
    """The one accelerator every record of ``runs`` trained on; SystemExit naming them where there are more."""
    devices = sorted({r['accelerator'] for r in runs})
    if len(devices) != 1:
        raise SystemExit(f'[{tag}] the runs trained on more than one accelerator ({devices}): a comparison is made on '
                         'one')
    return devices[0]
