"""Small helpers the package, its tools and its studies share (standard library only; matplotlib on demand)."""
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, TypeVar

V = TypeVar('V')
CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's content, as 64 hex digits."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(CHUNK), b''):
            digest.update(block)
    return digest.hexdigest()


def tensor_bytes(tensor) -> bytes:
    """The bytes of a tensor's values in row-major order, read from a contiguous CPU copy (no numpy needed)."""
    tensor = tensor.detach().to('cpu').contiguous()
    return ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size()) if tensor.numel() else b''


@contextlib.contextmanager
def atomic_path(path: str | Path, durable: bool = True) -> Iterator[Path]:
    """A temporary path in ``path``'s folder for the block to write (a new, empty file there, named
    ``.<name>.<pid>.<random>.part<suffix>``: the same suffix, for writers that choose the format by it), which
    replaces ``path`` in one rename when the block ends without an error; where it raises, or the process dies,
    ``path`` is left as it was (absent, or the old file) and the temporary file is removed (a killed process
    leaves it under its hidden name). So no reader, and no crash, ever sees a partial file under ``path``. The
    temporary file is created like any new file (mode 0666 less the process's umask, applied by the kernel); with
    ``durable`` the data and the rename are fsynced, so they survive a power loss too."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'.{path.name}.{os.getpid()}.{secrets.token_hex(4)}.part{path.suffix}')
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_path(path.parent)


def fsync_path(path: str | Path) -> None:
    """fsync the file or folder at ``path``: its data (a file's content, a folder's entries: a rename into it)
    reaches the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: bytes | Callable[[BinaryIO], object],
                 durable: bool = True) -> Path:
    """Write ``path`` whole or not at all (``atomic_path``): ``write`` (bytes, or a function given the open
    binary file) fills the temporary file, which then replaces ``path``."""
    with atomic_path(path, durable) as tmp, open(tmp, 'wb') as f:
        if isinstance(write, (bytes, bytearray)):
            f.write(write)
        else:
            write(f)
    return Path(path)


def strip_prefix(state: Mapping[str, V], prefix: str, source: str = 'the checkpoint') -> dict[str, V]:
    """The entries under ``prefix`` (a trailing '.' is implied), without it; a ValueError if there are none."""
    prefix = prefix if prefix.endswith('.') else prefix + '.'
    out = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not out:
        raise ValueError(f'no key of {source} starts with prefix {prefix!r}; first keys: {list(state)[:6]}')
    return out


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed), selected when a figure is drawn."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


@functools.cache
def cpu_flags() -> frozenset:
    """The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read: not Linux, not x86)."""
    try:
        return frozenset(re.search(r'^flags\s*:(.*)$', Path('/proc/cpuinfo').read_text(), re.M).group(1).split())
    except (OSError, AttributeError):
        return frozenset()


def cpu_info() -> dict:
    """The CPU model, the vector ISA torch dispatches to, and the flags that decide bf16 and int8 speed: what
    every measured figure is reported with."""
    import torch
    try:
        text = Path('/proc/cpuinfo').read_text()
    except OSError:
        text = ''
    model = re.search(r'^model name\s*:\s*(.+)$', text, re.M)
    wanted = ('avx2', 'avx512f', 'avx512_vnni', 'avx_vnni', 'avx512_bf16', 'amx_bf16', 'amx_tile')
    return dict(cpu=model.group(1).strip() if model else platform.processor() or platform.machine(),
                isa=torch.backends.cpu.get_cpu_capability(), flags=[f for f in wanted if f in cpu_flags()])
