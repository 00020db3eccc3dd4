"""Published weights by model name: where they are, fetching them once, checking them.

``PRETRAINED`` lists, per model, the public copies of the official ImageNet-1k weights in the order they are
tried: timm's hub file (safetensors), timm's release file and mmseg's converted file (``.pth``). Each has its
key layout, which ``convert.to_native`` reads, and a checksum where one is published: the sha256 prefix that
timm's and OpenMMLab's file names carry (the torch hub convention). A hub server that states a file's sha256
as its ETag (as LFS files do) is checked against that too.

``fetch_weights(name)`` returns a local file: the first source already in the cache (``$CPVT_WEIGHTS_DIR``,
default torch hub's ``checkpoints`` folder) or downloaded there. A download goes to ``<file>.partial``, resumes
from it after an interruption (HTTP range requests), is checked, and only then renamed to its final name, so a
file under the final name is always a whole, checked one; a file that fails its check is deleted. Offline, the
error lists every URL and the path to save a copy to by hand. Columnar CPVT has no published weights (the
authors never released them); asking for them says so and how to train them.
"""
import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

CHUNK = 1 << 20


@dataclass(frozen=True)
class WeightSource:
    url: str
    filename: str                      # the name it is cached under
    layout: str                        # what ``convert.detect_layout`` calls it: 'native', 'mmseg', ...
    sha256_prefix: Optional[str] = None   # as published in the file name
    classifier: bool = True            # holds the ImageNet head (a backbone-only file does not)
    note: str = ''


_TIMM_HUB = 'https://huggingface.co/timm/twins_pcpvt_{size}.in1k/resolve/main/model.safetensors'
_TIMM_RELEASE = 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vt3p-weights/{file}'
_MMSEG = 'https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/twins/{file}'
_RELEASES = {'small': ('twins_pcpvt_small-e70e7e7a.pth', 'pcpvt_small_20220308-e638c41c.pth'),
             'base': ('twins_pcpvt_base-e5ecb09b.pth', 'pcpvt_base_20220308-0621964c.pth'),
             'large': ('twins_pcpvt_large-d273f802.pth', 'pcpvt_large_20220308-37579dc6.pth')}


def _hash_in_name(filename: str) -> Optional[str]:
    m = re.search(r'-([0-9a-f]{8,})\.\w+$', filename)
    return m.group(1) if m else None


PRETRAINED: Dict[str, Tuple[WeightSource, ...]] = {
    f'pcpvt_{size}': (
        WeightSource(_TIMM_HUB.format(size=size), f'twins_pcpvt_{size}.in1k.safetensors', 'native',
                     note="timm's hub file"),
        WeightSource(_TIMM_RELEASE.format(file=timm_file), timm_file, 'native', _hash_in_name(timm_file),
                     note="timm's release file (the official Twins weights)"),
        WeightSource(_MMSEG.format(file=mmseg_file), mmseg_file, 'mmseg', _hash_in_name(mmseg_file), classifier=False,
                     note="mmseg's converted file (backbone only: no classifier head)"),
    ) for size, (timm_file, mmseg_file) in _RELEASES.items()}

UNPUBLISHED = ('cpvt_tiny', 'cpvt_small', 'cpvt_base', 'cpvt_tiny_gap', 'cpvt_small_gap', 'cpvt_base_gap',
               'pcpvt_tiny')


class WeightsUnavailableError(RuntimeError):
    """No published weights for a name, or none could be fetched."""


def weights_dir() -> Path:
    """Where weights are cached: ``$CPVT_WEIGHTS_DIR``, else torch hub's ``checkpoints`` folder."""
    return Path(os.environ.get('CPVT_WEIGHTS_DIR') or Path(torch.hub.get_dir()) / 'checkpoints')


def sources(name: str, classifier: bool = False) -> Tuple[WeightSource, ...]:
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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(CHUNK), b''):
            digest.update(block)
    return digest.hexdigest()


def check_file(path: Path, source: WeightSource, etag: Optional[str] = None) -> None:
    """Raise (after deleting ``path``) if its sha256 disagrees with the published prefix or a sha256 ETag."""
    expected = [h for h in (source.sha256_prefix, etag) if h]
    if not expected:
        return
    digest = file_sha256(path)
    for h in expected:
        if not digest.startswith(h.lower()):
            path.unlink()
            raise WeightsUnavailableError(f'{source.url}: the downloaded file\'s sha256 {digest[:16]}... does not '
                                          f'match the published {h}; it was deleted (a corrupted or partial copy)')


def _progress(done: int, total: Optional[int], name: str) -> None:
    if total:
        sys.stderr.write(f'\r[weights] {name}: {done / 2 ** 20:.1f} / {total / 2 ** 20:.1f} MiB '
                         f'({100 * done / total:.0f}%)')
    else:
        sys.stderr.write(f'\r[weights] {name}: {done / 2 ** 20:.1f} MiB')
    sys.stderr.flush()


def download(source: WeightSource, path: Path, timeout: float = 60.) -> Path:
    """Fetch ``source`` to ``path`` through ``path.partial``, resuming a partial file, checking the result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + '.partial')
    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(source.url, headers={'User-Agent': 'cpvt_backbones'})
    if have:
        request.add_header('Range', f'bytes={have}-')
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if have and response.status != 206:  # the server ignored the range: start over
            have = 0
        length = response.headers.get('Content-Length')
        total = have + int(length) if length is not None else None
        etag = (response.headers.get('X-Linked-Etag') or response.headers.get('ETag') or '').strip('"W/ ')
        etag = etag if re.fullmatch(r'[0-9a-f]{64}', etag) else None
        done = have
        with open(partial, 'ab' if have else 'wb') as f:
            for block in iter(lambda: response.read(CHUNK), b''):
                f.write(block)
                done += len(block)
                _progress(done, total, source.filename)
        sys.stderr.write('\n')
    if total is not None and done != total:
        raise WeightsUnavailableError(f'{source.url}: the connection ended after {done} of {total} bytes; '
                                      f'{partial} is kept and the next attempt resumes from it')
    check_file(partial, source, etag)
    os.replace(partial, path)
    return path


def fetch_weights(name: str, classifier: bool = False, directory: Optional[Path] = None
                  ) -> Tuple[Path, WeightSource]:
    """A local, checked copy of ``name``'s published weights (see the module docstring) and its source; with
    ``classifier``, from a file that holds the ImageNet head."""
    candidates = sources(name, classifier)
    directory = Path(directory) if directory is not None else weights_dir()
    for source in candidates:
        path = directory / source.filename
        if path.is_file():
            check_file(path, source)
            return path, source
    errors = []
    for source in candidates:
        try:
            return download(source, directory / source.filename), source
        except (urllib.error.URLError, http.client.HTTPException, OSError, WeightsUnavailableError) as e:
            errors.append(f'  {source.url}\n    ({type(e).__name__}: {e}) -> save it as {directory / source.filename}')
    raise WeightsUnavailableError(
        f'could not fetch the weights of {name!r}; tried, in order:\n' + '\n'.join(errors) +
        '\nDownload any one of them by hand and save it under the name shown (or set CPVT_WEIGHTS_DIR), '
        'or pass pretrained=PATH')


def is_url(text: str) -> bool:
    return text.startswith(('http://', 'https://'))


def fetch_url(url: str, directory: Optional[Path] = None) -> Path:
    """A URL's file in the cache (fetched once; checked against the sha256 prefix in its name, if any)."""
    filename = url.rstrip('/').rsplit('/', 1)[-1].split('?')[0] or 'weights'
    source = WeightSource(url, filename, 'unknown', _hash_in_name(filename))
    path = (Path(directory) if directory is not None else weights_dir()) / filename
    if path.is_file():
        check_file(path, source)
        return path
    return download(source, path)


def resolve_checkpoint(spec: str, classifier: bool = False) -> Path:
    """A local file for ``spec``: an existing path, a URL (fetched once), or a model name with published
    weights (``fetch_weights``; with ``classifier``, a file that holds the ImageNet head)."""
    if is_url(spec):
        return fetch_url(spec)
    if Path(spec).is_file():
        return Path(spec)
    if spec in PRETRAINED or spec in UNPUBLISHED:
        return fetch_weights(spec, classifier)[0]
    raise FileNotFoundError(f'{spec!r} is not a file, a URL or a model with published weights '
                            f'({sorted(PRETRAINED)})')


__all__ = ['PRETRAINED', 'UNPUBLISHED', 'WeightSource', 'WeightsUnavailableError', 'check_file', 'download',
           'fetch_url', 'fetch_weights', 'file_sha256', 'is_url', 'resolve_checkpoint', 'sources', 'weights_dir']
