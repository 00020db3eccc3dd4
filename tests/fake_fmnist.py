"""A Fashion-MNIST-shaped directory for the studies' tests: class k is a bright bar at row 2k (position carries
the label); the training split gzipped, the test split plain, as Debian's package and a user's unpacked copy."""
import gzip
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b''.join(int(n).to_bytes(4, 'big') for n in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(path, 'wb') as f:
            f.write(data)
    else:
        path.write_bytes(data)


def make_fake_fmnist(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for stem, n, compress in (('train', 160, True), ('t10k', 48, False)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28))
        for i, k in enumerate(labels):
            images[i, 2 * k + 4:2 * k + 6, 4:24] = 255
        suffix = '.gz' if compress else ''
        write_idx(root / f'{stem}-images-idx3-ubyte{suffix}', images, compress)
        write_idx(root / f'{stem}-labels-idx1-ubyte{suffix}', labels, compress)
    return root
