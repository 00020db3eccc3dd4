"""Running an OpenMMLab inferencer over image files one at a time (``tools/infer.py``): which files can be read,
output names that keep every input apart, and a run that goes on past an image that fails."""
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

SEPARATOR = '__'  # stands for a folder separator in an output name: a/x.png -> a__x
OUTPUT_KINDS = ('vis', 'preds')


class ImageError(Exception):
    """An image that cannot be run; the message says why, in one line."""


def one_line(error: BaseException) -> str:
    """``error`` as ``Type: message`` on one line (OpenCV's messages span several)."""
    message = ' '.join(str(error).split())
    return f'{type(error).__name__}: {message}' if message else type(error).__name__


def check_image(path: str) -> tuple[int, int]:
    """The (height, width) of the image file at ``path`` as the test pipelines' ``LoadImageFromFile`` decodes it
    (``mmcv.imfrombytes``, OpenCV); ``ImageError`` saying why where there is none: a file that cannot be read, an
    empty file, bytes OpenCV cannot decode (not an image, truncated), an image without pixels."""
    import mmcv
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ImageError(f'cannot be read ({one_line(e)})') from e
    if not data:
        raise ImageError('empty file (0 bytes)')
    try:
        image = mmcv.imfrombytes(data)
    except Exception as e:  # OpenCV raises on some malformed bytes and returns None on others
        raise ImageError(f'not an image OpenCV can decode ({one_line(e)})') from e
    if image is None:
        raise ImageError('not an image OpenCV can decode')
    if image.size == 0:
        raise ImageError(f'an image without pixels ({image.shape[1]} x {image.shape[0]})')
    return image.shape[0], image.shape[1]


def failing_as(stage: str, step: Callable) -> Callable:
    """``step`` whose exceptions come out as ``ImageError`` saying that ``stage`` failed, and how."""
    def run(*args, **kwargs):
        try:
            return step(*args, **kwargs)
        except Exception as e:
            raise ImageError(f'{stage} failed ({one_line(e)})') from e
    return run


def unique_names(paths: Sequence[str]) -> list[str]:
    """One output name per image path (distinct paths), distinct even where the file system ignores case, and
    the same for the same paths in the same order. An image whose stem no other image has keeps it
    (``a/x.png`` -> ``x``); images whose names collide are named by their path relative to the common folder of
    all the paths, ``SEPARATOR`` for each folder separator (``a/x.png`` -> ``a__x``, ``b/x.png`` -> ``b__x``),
    with the extension where that still collides (``a__x_png``), numbered last (``a__x_png-2``)."""
    files = [Path(os.path.abspath(p)) for p in paths]
    root = Path(os.path.commonpath([f.parent for f in files])) if files else Path()
    options = []
    for f in files:
        folders = f.parent.relative_to(root).parts
        options.append([f.stem, SEPARATOR.join(folders + (f.stem,)),
                        SEPARATOR.join(folders + (f.name.replace('.', '_'),))])
    level = [0] * len(files)
    while True:
        names = [choices[i] for choices, i in zip(options, level, strict=False)]
        count = Counter(n.casefold() for n in names)
        clash = [i for i, n in enumerate(names) if count[n.casefold()] > 1 and level[i] + 1 < len(options[i])]
        if not clash:
            break
        for i in clash:
            level[i] += 1
    taken, unique = set(), []
    for name in names:
        candidate, number = name, 1
        while candidate.casefold() in taken:
            number += 1
            candidate = f'{name}-{number}'
        taken.add(candidate.casefold())
        unique.append(candidate)
    return unique


def run_each(run: Callable[[str, str], None], images: Sequence[str], names: Sequence[str], out_dir: str) -> list[str]:
    """Run ``run(image, folder)`` on each image in turn, each writing its outputs under ``folder``/vis and
    ``folder``/preds, and move them to ``out_dir``/vis and ``out_dir``/preds as ``<name><their extension>``
    (``names``: ``unique_names``) once the image is done, so that what is written stays written whatever comes
    next. An image ``check_image`` refuses is not run; an image that is refused or whose run raises gets one line
    naming its path and why, and nothing written for it; the rest go on. Returns the paths of those that
    failed."""
    out = Path(out_dir)
    for kind in OUTPUT_KINDS:
        (out / kind).mkdir(parents=True, exist_ok=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix='.staging-', dir=out) as staging:
        for image, name in zip(images, names, strict=False):
            done, size = False, ''
            try:
                height, width = check_image(image)
                size = f'{width} x {height} image: '
                run(image, staging)
                done = True
            except Exception as e:
                reason = str(e) if isinstance(e, ImageError) else one_line(e)
                print(f'[infer] {image}: failed ({size}{reason}); nothing written for it')
                failed.append(image)
            for kind in OUTPUT_KINDS:
                for made in sorted(Path(staging, kind).glob('*')):
                    if done:
                        made.replace(out / kind / f'{name}{made.suffix}')
                    else:
                        made.unlink()
    return failed
