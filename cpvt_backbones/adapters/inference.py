"""Running an OpenMMLab inferencer over image files (``tools/infer.py``): which files can be read, output names that
keep every input apart, the model run on padded batches of images of similar size ahead of their turn
(``BatchedPredictions``), and a run that writes each image's outputs in turn and goes on past an image that
fails."""
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from ..deploy.batched import Progress, size_batches

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


class BatchedPredictions:
    """An inferencer (mmdet's ``DetInferencer``, mmseg's ``MMSegInferencer``) whose model runs batches of images
    ahead of their turn: ``prefetch(paths)`` predicts the images in one padded batch and keeps each prediction,
    and the inferencer's own run of one of them (``forward``, replaced on the instance) takes it instead of
    running the model again, everything else (pipeline, drawing, writing) as before. The model must predict each
    image of a padded batch as alone (``adapters.alone.predict_alone``), so that a prediction does not depend on
    its batch. A batch that fails (an image the pipeline cannot take) leaves its images to run alone."""

    def __init__(self, inferencer):
        self.inferencer, self.forward = inferencer, inferencer.forward
        self.ready: dict[str, object] = {}
        inferencer.forward = self

    def prefetch(self, paths: Sequence[str]) -> None:
        if len(paths) < 2:
            return
        try:
            for chunk in self.inferencer.preprocess(list(paths), batch_size=len(paths)):
                data = chunk[1] if isinstance(chunk, tuple) else chunk   # mmdet's come with the original inputs
                for prediction in self.forward(data):
                    self.ready[prediction.img_path] = prediction
        except Exception:  # any failure of the batch: its images run alone, where a failing one is reported
            for path in paths:
                self.ready.pop(path, None)

    def __call__(self, data, **kwargs):
        paths = [sample.img_path for sample in data['data_samples']]
        if paths and all(path in self.ready for path in paths):
            return [self.ready.pop(path) for path in paths]
        return self.forward(data, **kwargs)


def run_each(run: Callable[[str, str], None], images: Sequence[str], names: Sequence[str], out_dir: str,
             prefetch: Callable[[list[str]], None] | None = None, batch_size: int = 1) -> list[str]:
    """Run ``run(image, folder)`` on each image in turn, each writing its outputs under ``folder``/vis and
    ``folder``/preds, and move them to ``out_dir``/vis and ``out_dir``/preds as ``<name><their extension>``
    (``names``: ``unique_names``) once the image is done, so that what is written stays written whatever comes
    next. An image ``check_image`` refuses is not run; an image that is refused or whose run raises gets one line
    naming its path and why, and nothing written for it; the rest go on. With ``prefetch``
    (``BatchedPredictions.prefetch``) the images that can be read are taken in batches of ``batch_size`` of
    similar size (``deploy.batched.size_batches``), each batch prefetched before its images run. A long run
    reports its progress every ``deploy.batched.PROGRESS_EVERY`` seconds. Returns the paths of those that
    failed."""
    out = Path(out_dir)
    for kind in OUTPUT_KINDS:
        (out / kind).mkdir(parents=True, exist_ok=True)
    failed, sizes = [], {}
    for image in images:
        try:
            sizes[image] = check_image(image)
        except ImageError as e:
            sizes[image] = e
    order, starts = list(images), {}
    if prefetch is not None:   # readable images by batch, then the others (which fail)
        readable = [image for image in images if not isinstance(sizes[image], ImageError)]
        batches = [[readable[i] for i in batch] for batch in size_batches([sizes[i] for i in readable], batch_size)]
        starts = {batch[0]: batch for batch in batches}
        order = [image for batch in batches for image in batch]
        order += [image for image in images if isinstance(sizes[image], ImageError)]
    name_of = dict(zip(images, names, strict=True))
    progress = Progress(len(images), lambda line: print(f'[infer] {line}', flush=True))
    with tempfile.TemporaryDirectory(prefix='.staging-', dir=out) as staging:
        for count, image in enumerate(order, 1):
            name, done, size = name_of[image], False, ''
            try:
                if isinstance(sizes[image], ImageError):
                    raise sizes[image]
                height, width = sizes[image]
                size = f'{width} x {height} image: '
                if prefetch is not None and image in starts:
                    prefetch(starts[image])
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
            progress(count)
    return sorted(failed, key=images.index)
