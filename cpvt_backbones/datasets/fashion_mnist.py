"""Fashion-MNIST from its IDX files (Debian's ``dataset-fashion-mnist`` installs them), read with numpy only.

Nothing is downloaded: the files are read from ``root``, by default where the Debian package puts them.
"""
import gzip
from pathlib import Path

import numpy as np

DEFAULT_ROOT = Path('/usr/share/datasets/fashion-mnist')
CLASSES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag',
           'Ankle boot')
SPLITS = {'train': 'train', 'test': 't10k'}
HOW_TO_GET = ("install Debian's package (apt-get install dataset-fashion-mnist) or pass the directory that "
              "holds {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]")


def _find(root: Path, stem: str) -> Path:
    for name in (f'{stem}.gz', stem):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f'Fashion-MNIST file {stem}[.gz] not found in {root}: {HOW_TO_GET}')


def read_idx(path: str | Path, ndim: int) -> np.ndarray:
    """An unsigned-byte IDX array (magic 0x0000080N with N = ``ndim``), gzipped or not."""
    path = Path(path)
    with (gzip.open(path, 'rb') if path.suffix == '.gz' else open(path, 'rb')) as f:
        data = f.read()
    if len(data) < 4 + 4 * ndim or data[:2] != b'\0\0' or data[2] != 0x08 or data[3] != ndim:
        raise ValueError(f'{path} is not an unsigned-byte IDX file with {ndim} dimension(s) '
                         f'(header {data[:4].hex() or "empty"})')
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f'{path}: header says shape {shape} ({int(np.prod(shape))} bytes), file has {body.size}')
    return body.reshape(shape)


def load_fashion_mnist(split: str, root: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)``: uint8 (N, 28, 28) and int64 (N,) for ``split`` 'train' (60,000) or 'test' (10,000)."""
    if split not in SPLITS:
        raise ValueError(f'split must be one of {sorted(SPLITS)}, got {split!r}')
    root = Path(root) if root is not None else DEFAULT_ROOT
    if not root.is_dir():
        raise FileNotFoundError(f'Fashion-MNIST directory {root} does not exist: {HOW_TO_GET}')
    images = read_idx(_find(root, f'{SPLITS[split]}-images-idx3-ubyte'), 3)
    labels = read_idx(_find(root, f'{SPLITS[split]}-labels-idx1-ubyte'), 1).astype(np.int64)
    if len(images) != len(labels):
        raise ValueError(f'{root}: {len(images)} {split} images but {len(labels)} labels')
    if labels.size and labels.max() >= len(CLASSES):
        raise ValueError(f'{root}: label {labels.max()} outside 0..{len(CLASSES) - 1}')
    return images, labels
