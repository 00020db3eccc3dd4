"""Running an OpenMMLab inferencer over image files (``tools/infer.py``): the checkpoint loaded strictly
(``StrictWeights``), which files can be read, output names that keep every input apart, the model run on padded
batches of images of similar size ahead of their turn (``BatchedPredictions``), and a run that writes each image's
outputs in turn, each whole or not at all, and goes on past an image that fails."""
import contextlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..deploy.batched import Progress, size_batches
from ..utils import fsync_path

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


class StrictWeights:
    """Mixed in before an OpenMMLab inferencer (mmdet's ``DetInferencer``, mmseg's ``MMSegInferencer``) built with
    ``weights=CHECKPOINT``: the checkpoint must fit the model exactly, and (unless ``allow_nonfinite=True``, a
    keyword of the constructor) hold no NaN or Inf weights, before its weights are loaded
    (``adapters.runner.refuse_unfit``, naming the checkpoint and the config); the inferencers themselves load
    what fits and warn. An empty, truncated or corrupt file is a ``WeightFileError`` naming it (the checkpoint
    opt-in, ``adapters.checkpoint``). The inferencers' way of ``custom_hooks.strict_checkpoint``."""

    def __init__(self, *args, weights=None, allow_nonfinite: bool = False, **kwargs):
        self.checkpoint_file, self.allow_nonfinite = weights, allow_nonfinite
        super().__init__(*args, weights=weights, **kwargs)

    def _load_weights_to_model(self, model, checkpoint, cfg):
        if checkpoint is not None:
            from .runner import refuse_unfit
            refuse_unfit(model, checkpoint, f'checkpoint {self.checkpoint_file} (config {cfg.filename})',
                         self.allow_nonfinite)
        super()._load_weights_to_model(model, checkpoint, cfg)


class BatchedPredictions:
    """An inferencer (mmdet's ``DetInferencer``, mmseg's ``MMSegInferencer``) whose model runs batches of images
    ahead of their turn: ``prefetch(paths)`` runs the inferencer's pipeline on each image, collates them
    (``inferencer.collate_fn``, as the inferencer's own ``preprocess`` does) and predicts them in one call of the
    inferencer's ``forward`` (``model.test_step``), keeping each prediction; the inferencer's own run of one of
    them (``forward``, replaced on the instance) takes it instead of running the model again, everything else
    (pipeline, drawing, writing) as before. The model must predict each image of a padded batch as alone
    (``adapters.alone.predict_alone``), so that a prediction does not depend on its batch. An image whose
    pipeline raises ``ImageError`` (a pipeline wrapped by ``failing_as``) is left out of the batch, to run alone
    where its failure is reported; every other error, of the pipeline or of the model, propagates. ``batched``
    counts the images predicted in batches of two or more, ``calls`` those batches."""

    def __init__(self, inferencer):
        self.inferencer, self.forward = inferencer, inferencer.forward
        self.ready: dict[str, object] = {}
        self.batched = self.calls = 0
        inferencer.forward = self

    def prefetch(self, paths: Sequence[str]) -> None:
        samples = {}
        for path in paths:
            try:
                samples[path] = self.inferencer.pipeline(path)
            except ImageError:
                continue
        if len(samples) < 2:
            return
        predictions = self.forward(self.inferencer.collate_fn(list(samples.values())))
        if len(predictions) != len(samples):
            raise RuntimeError(f'the model returned {len(predictions)} predictions for a batch of {len(samples)}')
        for path, prediction in zip(samples, predictions, strict=True):
            if prediction.metainfo.get('img_path') != path:
                raise ValueError(f"the prediction of {path} names {prediction.metainfo.get('img_path')!r} as its "
                                 "image: the test pipeline's Pack*Inputs must keep 'img_path' in its meta_keys for "
                                 'batches (or run one image at a time)')
            self.ready[path] = prediction
        self.batched += len(samples)
        self.calls += 1

    def __call__(self, data, **kwargs):
        paths = [sample.metainfo.get('img_path') for sample in data['data_samples']]
        if paths and all(path in self.ready for path in paths):
            return [self.ready.pop(path) for path in paths]
        return self.forward(data, **kwargs)


STAGING = '.staging-'   # the prefix of a run's folder under the output folder, where an image's outputs are made


@contextlib.contextmanager
def staging_folder(out: Path) -> Iterator[tuple[Path, list[str]]]:
    """A new folder ``out``/.staging-* for this run, held (an exclusive ``fcntl.flock`` on the folder) while the
    block runs and removed after, and the names of the staging folders of earlier runs it removed first: those
    nobody holds (left by a run that was killed), never a running one's. ``out`` itself is locked while the
    folders are removed and the new one is made and held, so that no run removes another's new folder. Where
    fcntl is missing (Windows) the folder is not held and no earlier one is removed."""
    try:
        import fcntl
    except ImportError:
        with tempfile.TemporaryDirectory(prefix=STAGING, dir=out) as folder:
            yield Path(folder), []
        return
    removed, held = [], None
    guard = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        for old in sorted(out.glob(f'{STAGING}*')):
            if old.is_symlink() or not old.is_dir():
                continue
            try:
                fd = os.open(old, os.O_RDONLY)
            except OSError:   # not ours to open: left where it is
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(old, ignore_errors=True)
                if not old.exists():
                    removed.append(old.name)
            except BlockingIOError:   # held: a running run's
                pass
            finally:
                os.close(fd)
        folder = Path(tempfile.mkdtemp(prefix=STAGING, dir=out))
        held = os.open(folder, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)
    except BaseException:
        if held is not None:
            os.close(held)
        raise
    finally:
        os.close(guard)   # closing the descriptor releases its lock
    try:
        yield folder, removed
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(held)


def run_each(run: Callable[[str, str], None], images: Sequence[str], names: Sequence[str], out_dir: str,
             prefetch: Callable[[list[str]], None] | None = None, batch_size: int = 1) -> list[str]:
    """Run ``run(image, folder)`` on each image in turn, each writing its outputs under ``folder``/vis and
    ``folder``/preds, and move them to ``out_dir``/vis and ``out_dir``/preds as ``<name><their extension>``
    (``names``: ``unique_names``) once the image is done, each file fsynced and renamed into place (whole or not at
    all, even after a crash), so that what is written stays written whatever comes next; ``folder`` is this run's
    staging folder (``staging_folder``: those that killed runs left are removed first, and named in one line).
    An image ``check_image`` refuses is not run; an image that is refused or whose run raises gets one line naming
    its path and why, and nothing written for it; the rest go on. The outputs
    an earlier run left in ``out_dir`` under an image's name (``<name>.*`` in vis and preds) are removed where
    the image fails, and where it is done those its new outputs do not replace, so that every image's outputs
    there are this run's. With ``prefetch`` (``BatchedPredictions.prefetch``) the images that can be read are
    taken in batches of ``batch_size`` of similar size (``deploy.batched.size_batches``), each batch prefetched
    before its images run (an error of ``prefetch`` propagates). A long run reports its progress every
    ``deploy.batched.PROGRESS_EVERY`` seconds. Returns the paths of those that failed."""
    out = Path(out_dir)
    earlier: dict[str, list[Path]] = {}
    for kind in OUTPUT_KINDS:
        (out / kind).mkdir(parents=True, exist_ok=True)
        for made in (out / kind).iterdir():
            if made.is_file() or made.is_symlink():
                earlier.setdefault(made.stem, []).append(made)
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
        starts = {batch[0]: batch for batch in batches if len(batch) > 1}
        order = [image for batch in batches for image in batch]
        order += [image for image in images if isinstance(sizes[image], ImageError)]
    name_of = dict(zip(images, names, strict=True))
    progress = Progress(len(images), lambda line: print(f'[infer] {line}', flush=True))
    with staging_folder(out) as (staging, removed):
        if removed:
            print(f'[infer] removed {len(removed)} staging folder(s) that runs which did not finish left in {out}: '
                  f'{", ".join(removed)}')
        for count, image in enumerate(order, 1):
            name, done, size = name_of[image], False, ''
            if image in starts:
                prefetch(starts[image])
            try:
                if isinstance(sizes[image], ImageError):
                    raise sizes[image]
                height, width = sizes[image]
                size = f'{width} x {height} image: '
                run(image, staging)
                done = True
            except Exception as e:
                reason = str(e) if isinstance(e, ImageError) else one_line(e)
            made = [(kind, p) for kind in OUTPUT_KINDS for p in sorted(Path(staging, kind).glob('*'))]
            kept = {out / kind / f'{name}{p.suffix}' for kind, p in made} if done else set()
            stale = [p for p in earlier.pop(name, []) if p not in kept]
            for p in stale:
                p.unlink(missing_ok=True)
            for kind, p in made:
                if done:
                    fsync_path(p)
                    p.replace(out / kind / f'{name}{p.suffix}')
                else:
                    p.unlink()
            for kind in {kind for kind, _ in made} if done else ():
                fsync_path(out / kind)
            if not done:
                gone = f' (its earlier outputs removed: {", ".join(f"{p.parent.name}/{p.name}" for p in stale)})'
                print(f'[infer] {image}: failed ({size}{reason}); nothing written for it{gone if stale else ""}')
                failed.append(image)
            progress(count)
    return sorted(failed, key=images.index)
