"""Published weights by model name: where they are, fetching them once, checking them (docs/reliability.md).

``PRETRAINED`` lists, per model, the public copies of the official ImageNet-1k weights in the order they are
tried, each with its key layout (``convert.to_native`` reads it) and the sha256 prefix its file name publishes,
if any. ``fetch_weights(name)`` and ``fetch_url(url)`` return a local file in the cache (``weights_dir``):

* a download goes to ``<file>.partial`` and is checked (its sha256 against the published prefix and a sha256
  ETag; a weight file the safe loader reads, ``read_problem``) before it is renamed, beside its record
  ``<file>.sha256`` (URL and sha256);
* every load from the cache checks the file against its record and the published prefix (a file with neither
  is not used); one that fails is downloaded again (offline: named in the error);
* concurrent fetches of one file (threads, processes) serialise on ``<file>.lock`` (``file_lock``): one
  downloads, the others then find the checked file;
* an interrupted download resumes only with the server's validator for its bytes (``If-Range``), else starts
  over.

A failure raises ``WeightsUnavailableError``, naming every URL tried and what to do. The ``UNPUBLISHED`` names
have no published weights: asking for them raises it, naming the config that trains them.
"""
import contextlib
import hashlib
import http.client
import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

from ..utils import CHUNK, atomic_write, file_sha256
from .io import RefusedPickleError, read_weights, weight_file_problem


@dataclass(frozen=True)
class WeightSource:
    url: str
    filename: str                      # the name it is cached under
    layout: str                        # what ``convert.detect_layout`` calls it: 'native', 'mmseg', ...
    sha256_prefix: str | None = None   # as published in the file name
    classifier: bool = True            # holds the ImageNet head (a backbone-only file does not)
    note: str = ''


_TIMM_HUB = 'https://huggingface.co/timm/twins_pcpvt_{size}.in1k/resolve/main/model.safetensors'
_TIMM_RELEASE = 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vt3p-weights/{file}'
_MMSEG = 'https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/twins/{file}'
_RELEASES = {'small': ('twins_pcpvt_small-e70e7e7a.pth', 'pcpvt_small_20220308-e638c41c.pth'),
             'base': ('twins_pcpvt_base-e5ecb09b.pth', 'pcpvt_base_20220308-0621964c.pth'),
             'large': ('twins_pcpvt_large-d273f802.pth', 'pcpvt_large_20220308-37579dc6.pth')}


def _hash_in_name(filename: str) -> str | None:
    m = re.search(r'-([0-9a-f]{8,})\.\w+$', filename)
    return m.group(1) if m else None


PRETRAINED: dict[str, tuple[WeightSource, ...]] = {
    f'pcpvt_{size}': (
        WeightSource(_TIMM_HUB.format(size=size), f'twins_pcpvt_{size}.in1k.safetensors', 'native',
                     note="timm's hub file"),
        WeightSource(_TIMM_RELEASE.format(file=timm_file), timm_file, 'native', _hash_in_name(timm_file),
                     note="timm's release file (the official Twins weights)"),
        WeightSource(_MMSEG.format(file=mmseg_file), mmseg_file, 'mmseg', _hash_in_name(mmseg_file), classifier=False,
                     note="mmseg's converted file (backbone only: no classifier head)"),
    ) for size, (timm_file, mmseg_file) in _RELEASES.items()}

_SVT_HUB = 'https://huggingface.co/timm/twins_svt_{size}.in1k/resolve/main/model.safetensors'
_SVT_RELEASES = {'small': ('twins_svt_small-42e5f78c.pth', 'alt_gvt_small_20220308-7e1c3695.pth'),
                 'base': ('twins_svt_base-c2265010.pth', 'alt_gvt_base_20220308-1b7eb711.pth'),
                 'large': ('twins_svt_large-90f6aaa9.pth', 'alt_gvt_large_20220308-fb5936f3.pth')}
PRETRAINED.update({
    f'svt_{size}': (
        WeightSource(_SVT_HUB.format(size=size), f'twins_svt_{size}.in1k.safetensors', 'native',
                     note="timm's hub file"),
        WeightSource(_TIMM_RELEASE.format(file=timm_file), timm_file, 'native', _hash_in_name(timm_file),
                     note="timm's release file (the official Twins alt_gvt weights)"),
        WeightSource(_MMSEG.format(file=mmseg_file), mmseg_file, 'mmseg', _hash_in_name(mmseg_file), classifier=False,
                     note="mmseg's converted file (backbone only: no classifier head)"),
    ) for size, (timm_file, mmseg_file) in _SVT_RELEASES.items()})

UNPUBLISHED = ('cpvt_tiny', 'cpvt_small', 'cpvt_base', 'cpvt_tiny_gap', 'cpvt_small_gap', 'cpvt_base_gap',
               'pcpvt_tiny')


class WeightsUnavailableError(RuntimeError):
    """No published weights for a name, or none could be fetched."""


def weights_dir() -> Path:
    """Where weights are cached: ``$CPVT_WEIGHTS_DIR``, else torch hub's ``checkpoints`` folder."""
    return Path(os.environ.get('CPVT_WEIGHTS_DIR') or Path(torch.hub.get_dir()) / 'checkpoints')


def sources(name: str, classifier: bool = False) -> tuple[WeightSource, ...]:
    """The published copies of ``name``'s weights in the order they are tried (with ``classifier``, only
    those that hold the ImageNet head)."""
    if name in PRETRAINED:
        return tuple(s for s in PRETRAINED[name] if s.classifier or not classifier)
    if name in UNPUBLISHED:
        config = ('configs/shapes/pcpvt-tiny_shapes-cls.py' if name == 'pcpvt_tiny' else
                  f'configs/imagenet/{name.replace("_gap", "").replace("_", "-")}'
                  f'{"-gap" if name.endswith("_gap") else ""}_8xb128_in1k.py')
        raise WeightsUnavailableError(
            f'no weights are published for {name!r} (the CPVT authors released none for the columnar models; '
            f'pcpvt_tiny is this package\'s CPU-sized model). Train them with tools/train.py {config}, and point '
            'at the result (pretrained=PATH; in a config, init_cfg\'s checkpoint)')
    raise WeightsUnavailableError(f'unknown model {name!r}; published weights: {sorted(PRETRAINED)}')


def record_path(path: Path) -> Path:
    """The record beside a cached file: its URL and sha256, written when the download was checked."""
    return path.with_name(path.name + '.sha256')


def check_file(path: Path, source: WeightSource, etag: str | None = None) -> str:
    """``path``'s sha256; a ``WeightsUnavailableError``, after deleting ``path``, where it disagrees with
    ``source``'s published prefix or a sha256 ``etag``."""
    digest = file_sha256(path)
    for h in (source.sha256_prefix, etag):
        if h and not digest.startswith(h.lower()):
            path.unlink()
            raise WeightsUnavailableError(f'{source.url}: the downloaded file\'s sha256 {digest[:16]}... does not '
                                          f'match the published {h}; it was deleted (a corrupted or partial copy)')
    return digest


def cached(path: Path, source: WeightSource) -> str | None:
    """Why the cached ``path`` cannot be used for ``source`` (its sha256 differs from its record or from the
    published prefix, its record names another URL, it has neither to be checked by, or it is not a weight
    file), or None when it checks. Reads the whole file; a record without the ``content`` mark gets it once the
    file reads (``read_problem``)."""
    record = record_path(path)
    try:
        recorded = json.loads(record.read_text()) if record.is_file() else None
    except (OSError, ValueError) as e:
        return f'its record {record} cannot be read ({e})'
    if recorded is not None and recorded.get('url') != source.url:
        return f'its record says it came from {recorded.get("url")}, not {source.url}'
    if recorded is None and not source.sha256_prefix:
        return 'it has no record of a checked download and no published checksum to check it by'
    digest = file_sha256(path)
    if recorded is not None and digest != recorded.get('sha256'):
        return (f'its sha256 {digest[:16]}... differs from the {str(recorded.get("sha256"))[:16]}... recorded at '
                'download')
    if source.sha256_prefix and not digest.startswith(source.sha256_prefix):
        return f'its sha256 {digest[:16]}... does not match the published {source.sha256_prefix}'
    problem = weight_file_problem(path)
    if problem is None and recorded is not None and recorded.get('content') != 'weights':
        problem = read_problem(path)  # recorded before downloads were read: read once, then so recorded
        if problem is None:
            with contextlib.suppress(OSError):
                atomic_write(record, json.dumps(dict(recorded, content='weights')).encode())
    return problem


def read_problem(path: Path) -> str | None:
    """Why ``path`` is not a weight file that the package's safe loader reads (its content, then a full read), or
    None."""
    problem = weight_file_problem(path)
    if problem is not None:
        return problem
    try:
        read_weights(path)
    except RefusedPickleError as e:
        return str(e)
    except Exception as e:  # whatever a damaged file makes the readers raise
        return f'it cannot be read as a weight file ({type(e).__name__}: {e})'
    return None


def _progress(done: int, total: int | None, name: str) -> None:
    if total:
        sys.stderr.write(f'\r[weights] {name}: {done / 2 ** 20:.1f} / {total / 2 ** 20:.1f} MiB '
                         f'({100 * done / total:.0f}%)')
    else:
        sys.stderr.write(f'\r[weights] {name}: {done / 2 ** 20:.1f} MiB')
    sys.stderr.flush()


def _resume_from(partial: Path, url: str) -> tuple[int, str | None]:
    """How many bytes of ``partial`` a resume may keep, and the validator to send as If-Range: none (start over)
    unless its record names the same URL and a validator."""
    meta = partial.with_name(partial.name + '.json')
    try:
        recorded = json.loads(meta.read_text())
        have, validator = partial.stat().st_size, recorded['validator']
        if recorded['url'] != url or not validator or have != recorded.get('size', have):
            raise ValueError
        return have, validator
    except (OSError, ValueError, KeyError, TypeError):
        return 0, None


def _validator(headers) -> str | None:
    """What identifies this version of the file for If-Range: a strong ETag, else Last-Modified."""
    etag = headers.get('ETag')
    return etag if etag and not etag.startswith('W/') else headers.get('Last-Modified')


def download(source: WeightSource, path: Path, timeout: float = 60.) -> Path:
    """Download ``source`` to ``path`` through ``<path>.partial`` (module docstring: resumed, checked, recorded,
    renamed) and return ``path``. A ``WeightsUnavailableError`` where the connection ends early, a checksum
    differs or the file is not a weight file; urllib's and the file system's errors pass through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + '.partial')
    meta = partial.with_name(partial.name + '.json')
    have, validator = _resume_from(partial, source.url)
    request = urllib.request.Request(source.url, headers={'User-Agent': 'cpvt_backbones'})
    if have:
        request.add_header('Range', f'bytes={have}-')
        request.add_header('If-Range', validator)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if have and (response.status != 206 or
                     not (response.headers.get('Content-Range') or '').startswith(f'bytes {have}-')):
            have = 0  # the file changed (If-Range failed) or the server ignored the range: start over
        if not have:
            meta.unlink(missing_ok=True)
            validator = _validator(response.headers)
        length = response.headers.get('Content-Length')
        total = have + int(length) if length is not None else None
        etag = (response.headers.get('X-Linked-Etag') or response.headers.get('ETag') or '').strip('"W/ ')
        etag = etag if re.fullmatch(r'[0-9a-f]{64}', etag) else None
        done = have
        with open(partial, 'ab' if have else 'wb') as f:
            try:
                for block in iter(lambda: response.read(CHUNK), b''):
                    f.write(block)
                    done += len(block)
                    _progress(done, total, source.filename)
            finally:
                f.flush()
                if validator:  # what a resume needs; without it, the next attempt starts over
                    atomic_write(meta, json.dumps(dict(url=source.url, validator=validator, size=f.tell())).encode(),
                                 durable=False)
        sys.stderr.write('\n')
    if total is not None and done != total:
        raise WeightsUnavailableError(f'{source.url}: the connection ended after {done} of {total} bytes; '
                                      f'{partial} is kept and the next attempt resumes from it' if validator else
                                      f'{source.url}: the connection ended after {done} of {total} bytes (the '
                                      'server gives no validator to resume by: the next attempt starts over)')
    meta.unlink(missing_ok=True)
    digest = check_file(partial, source, etag)
    problem = read_problem(partial)
    if problem is not None:
        partial.unlink()
        raise WeightsUnavailableError(f'{source.url}: the download is not a weight file that this package reads '
                                      f'({problem}); it was not kept. Check the URL and the network (a captive '
                                      'portal or a proxy may answer in the server\'s place), then try again')
    atomic_write(record_path(path), json.dumps(dict(url=source.url, sha256=digest, content='weights')).encode())
    os.replace(partial, path)
    return path


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def file_lock(path: Path):
    """Hold the lock of ``path`` (a ``<file>.lock`` beside it) while the block runs: ``fcntl.flock`` between
    processes, a lock per path between this process's threads; it waits for any other holder, without a
    timeout. Where fcntl is missing (Windows), ``filelock``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_file = path.with_name(path.name + '.lock')
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(str(lock_file), threading.Lock())
    with thread_lock:
        try:
            import fcntl
        except ImportError:
            from filelock import FileLock
            with FileLock(str(lock_file)):
                yield
            return
        with open(lock_file, 'a+b') as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _from_cache(path: Path, source: WeightSource) -> tuple[Path | None, str | None]:
    """``path`` if it is in the cache and checks (``cached``); otherwise None and why not (None when absent). A
    file that does not check is left where it is, for a new download to replace."""
    if not path.is_file():
        return None, None
    problem = cached(path, source)
    return (path, None) if problem is None else (None, f'{path}: {problem}')


def _fetch(source: WeightSource, path: Path) -> Path:
    """The checked cached ``path``, else a new download of ``source`` that replaces whatever was there, under the
    file's lock (``file_lock``): a fetch that waited for another finds its checked file."""
    found, _ = _from_cache(path, source)
    if found is not None:
        return found
    with file_lock(path):
        return _fetch_locked(source, path)


def _fetch_locked(source: WeightSource, path: Path) -> Path:
    found, problem = _from_cache(path, source)
    if found is not None:
        return found
    if problem:
        sys.stderr.write(f'[weights] {problem}: downloading it again\n')
    try:
        return download(source, path)
    except (urllib.error.URLError, http.client.HTTPException, OSError, WeightsUnavailableError) as e:
        if problem:
            raise WeightsUnavailableError(f'{problem}; downloading it again failed ({type(e).__name__}: {e}). '
                                          f'Delete {path} and its .sha256 record, or pass it as pretrained=PATH '
                                          'if you trust it') from e
        raise


def fetch_weights(name: str, classifier: bool = False, directory: Path | None = None
                  ) -> tuple[Path, WeightSource]:
    """A local, checked copy of ``name``'s published weights (module docstring) and its source: the first source
    already cached in ``directory`` (default ``weights_dir()``), else the first that downloads; with
    ``classifier``, only files that hold the ImageNet head. A ``WeightsUnavailableError`` where none can."""
    candidates = sources(name, classifier)
    directory = Path(directory) if directory is not None else weights_dir()
    for source in candidates:
        found, _ = _from_cache(directory / source.filename, source)
        if found is not None:
            return found, source
    errors = []
    for source in candidates:
        try:
            return _fetch(source, directory / source.filename), source
        except (urllib.error.URLError, http.client.HTTPException, OSError, WeightsUnavailableError) as e:
            errors.append(f'  {source.url}\n    ({type(e).__name__}: {e})')
    raise WeightsUnavailableError(
        f'could not fetch the weights of {name!r}; tried, in order:\n' + '\n'.join(errors) +
        '\nDownload any one of them by hand and pass it as pretrained=PATH (or save a file whose name carries a '
        f'sha256 prefix in {directory}: a published prefix vouches for it), or set CPVT_WEIGHTS_DIR')


def is_url(text: str) -> bool:
    return text.startswith(('http://', 'https://'))


def url_path(url: str, directory: Path | None = None) -> Path:
    """Where ``fetch_url`` caches ``url``: ``<weights_dir>/url/<sha256 of the URL, 16 hex>/<its file name>``."""
    filename = url.rstrip('/').rsplit('/', 1)[-1].split('?')[0] or 'weights'
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    return (Path(directory) if directory is not None else weights_dir()) / 'url' / key / filename


def fetch_url(url: str, directory: Path | None = None) -> Path:
    """A URL's file in the cache (``url_path``): fetched once, checked against its record (and the sha256 prefix
    in its name, if any) on every load. A failed fetch raises ``WeightsUnavailableError`` naming the URL."""
    path = url_path(url, directory)
    try:
        return _fetch(WeightSource(url, path.name, 'unknown', _hash_in_name(path.name)), path)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise WeightsUnavailableError(
            f'could not fetch {url} ({type(e).__name__}: {e}). Check the URL and the network, or download the file '
            'by hand and pass its path') from e


def resolve_checkpoint(spec: str, classifier: bool = False) -> Path:
    """A local file for ``spec``: an existing path, a URL (``fetch_url``), or a model name with published
    weights (``fetch_weights``; with ``classifier``, a file that holds the ImageNet head). A
    ``FileNotFoundError`` where it is none of these."""
    if is_url(spec):
        return fetch_url(spec)
    if Path(spec).is_file():
        return Path(spec)
    if spec in PRETRAINED or spec in UNPUBLISHED:
        return fetch_weights(spec, classifier)[0]
    raise FileNotFoundError(f'{spec!r} is not a file, a URL or a model with published weights '
                            f'({sorted(PRETRAINED)})')


__all__ = ['PRETRAINED', 'UNPUBLISHED', 'WeightSource', 'WeightsUnavailableError', 'cached', 'check_file',
           'download', 'fetch_url', 'fetch_weights', 'file_lock', 'file_sha256', 'is_url', 'read_problem',
           'record_path', 'resolve_checkpoint', 'sources', 'url_path', 'weights_dir']
