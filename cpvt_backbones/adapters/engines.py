"""A config's model on an inference engine (``deploy.ENGINES``), for the tools, the mmengine hook and the demo: the
command-line options, calibration on the config's own test pipeline, caches named by content, and the one route
from a built detector, segmentor or classifier with its checkpoint loaded to that model on an engine,
``engine_model`` (taken by ``InferenceEngineHook`` once the checkpoint is loaded, ``custom_hooks.set_engine``,
and by tools/infer.py once the inferencer has loaded the weights). What runs on the engine:
``deploy.openmmlab.on_engine``.
"""
import argparse
import copy
import hashlib
import json
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from mmengine.config import Config

from ..deploy import PRECISIONS
from ..deploy.artifacts import package_versions
from ..deploy.registry import ENGINES, EngineRequest, engine_table
from ..utils import file_sha256
from .runner import build_runner, evaluation_datasets, load_checkpoint_strictly, our_backbone, our_backbone_types

DEFAULT_ENGINE = 'fused'
IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--precision``, ``--calibrate``, ``--calibrate-images`` and ``--keep-fp32`` (tools/test.py,
    tools/infer.py); the parser's epilog gets the engine x precision table of the registry."""
    parser.add_argument('--engine', choices=list(ENGINES),
                        help=f'the inference engine (default: {DEFAULT_ENGINE} for our backbones, torch for others; '
                             'table below)')
    parser.add_argument('--precision', choices=PRECISIONS, default='fp32', help='fp32, bf16 or int8 (table below)')
    parser.add_argument('--calibrate', metavar='IMAGES',
                        help="int8 calibration images: 'val' (the config's test set, the default) or a folder of "
                             "images, through the config's test pipeline; what the engine derives is saved and "
                             'reused')
    parser.add_argument('--calibrate-images', type=int, default=32, metavar='N', help='images calibrated on')
    parser.add_argument('--keep-fp32', nargs='*', metavar='MODULE',
                        help="int8: modules of the model (names as in named_modules, e.g. bbox_head.retina_cls) "
                             "whose layers stay float32; default: the config's int8_keep_fp32; none given: none")
    parser.epilog = ((parser.epilog or '') + '\nEngines (deploy.ENGINES):\n' + engine_table()).strip()


def engine_request(cfg: Config, args: argparse.Namespace) -> EngineRequest:
    """What ``add_engine_args`` asked for, as one ``EngineRequest`` checked for this config (``config_request``);
    a SystemExit naming the problem otherwise."""
    try:
        return config_request(cfg, args.engine or default_engine(cfg), args.precision, args.calibrate,
                              args.calibrate_images, args.keep_fp32)
    except (ValueError, ImportError) as e:
        raise SystemExit(str(e)) from e


def config_request(cfg: Config, engine: str | None = None, precision: str = 'fp32',
                   calibration_source: str | None = None,
                   calibration_images: int = 32, keep_fp32: Sequence[str] | None = None,
                   **options) -> EngineRequest:
    """The ``EngineRequest`` for the model of ``cfg``: ``engine`` (default ``default_engine(cfg)``) at
    ``precision``; at a precision the engine calibrates, on ``calibration_images`` of ``calibration_source`` ('val',
    the default, or a folder) with the modules of ``kept_in_fp32(cfg, keep_fp32)`` in float32 (given at another
    precision, the request refuses them); ``options``: the request's ``cache`` and ``float_cache`` (path prefixes
    instead of the names ``engine_model`` gives by content) and the engine's own. A ValueError where the request
    is refused (``EngineRequest.of``) or the engine covers the backbone and the config's backbone is not ours."""
    engine = engine or default_engine(cfg)
    if engine in ENGINES and precision in ENGINES[engine].calibrated:
        calibration_source, keep_fp32 = calibration_source or 'val', kept_in_fp32(cfg, keep_fp32)
    request = EngineRequest.of(engine, precision, keep_fp32 or (), calibration_source=calibration_source,
                               calibration_images=calibration_images, **options)
    if request.spec.covers == 'backbone' and our_backbone(cfg) is None:
        raise ValueError(f'engine {engine!r} runs our backbones ({", ".join(our_backbone_types())}); this config\'s '
                         f'backbone is {cfg.model.get("backbone", {}).get("type")!r}: use --engine torch')
    return request


def default_engine(cfg: Config) -> str:
    """``DEFAULT_ENGINE`` (the fused CPU kernels) where the config's backbone is ours, else torch."""
    return DEFAULT_ENGINE if our_backbone(cfg) is not None else 'torch'


def kept_in_fp32(cfg: Config, keep_fp32: Sequence[str] | None = None) -> tuple[str, ...]:
    """The modules that int8 leaves in float32: ``keep_fp32`` where given (an empty list: none), else the
    config's ``int8_keep_fp32`` (module names of its model, such as 'bbox_head.retina_cls')."""
    return tuple(cfg.get('int8_keep_fp32', ()) if keep_fp32 is None else keep_fp32)


def _calibration_source(source: str) -> tuple[str, str | list[Path]]:
    """('val', 'val'), or a folder's resolved path and its images (sorted); a ValueError where ``source`` is
    neither or the folder holds no images."""
    if source == 'val':
        return source, source
    folder = Path(source)
    if not folder.is_dir():
        raise ValueError(f"calibration: the source must be 'val' or a folder of images, got {source!r}")
    images = sorted(p for p in folder.rglob('*') if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise ValueError(f'calibration: no images ({", ".join(IMAGE_SUFFIXES)}) under {folder}')
    return str(folder.resolve()), images


def calibration_batches(cfg: Config, source: str | list[Path], num_images: int) -> Iterator[tuple[dict, int]]:
    """Test-step batches (and their sizes) of about ``num_images`` images of ``source``: 'val', the config's test
    set in order through its dataloader; or image files, in order, through the test pipeline without its
    annotation steps, where a file the pipeline cannot read is skipped with a warning naming it and the reason
    (and none readable is an error)."""
    from mmengine.dataset import Compose
    from mmengine.runner import Runner
    if source == 'val':
        batches = ((batch, len(batch['inputs'])) for batch in Runner.build_dataloader(cfg.test_dataloader))
    else:
        dataset = next(evaluation_datasets(cfg))  # the test set's (innermost) dataset
        batches = _image_batches(Compose([s for s in dataset.pipeline if 'Annotation' not in s['type']]), source)
    seen = 0
    for batch, size in batches:
        yield batch, size
        seen += size
        if seen >= num_images:
            return
    if not seen:
        raise ValueError('calibration: the config\'s test set is empty' if source == 'val' else
                         f'calibration: none of the {len(source)} image(s) could be read (each named in a warning)')


def _image_batches(pipeline, images: list[Path]) -> Iterator[tuple[dict, int]]:
    from mmengine.dataset import pseudo_collate
    for i, path in enumerate(images):
        try:
            data = pipeline(dict(img_path=str(path), img_id=i))
        except Exception as e:  # whatever the pipeline's reader raises on a file it cannot read
            warnings.warn(f'calibration: {path} skipped ({type(e).__name__}: {e})', RuntimeWarning, stacklevel=2)
            continue
        if data is None:
            warnings.warn(f'calibration: {path} skipped (the pipeline dropped it)', RuntimeWarning, stacklevel=2)
            continue
        yield pseudo_collate([data]), 1


def cache_name(cfg: Config, checkpoint: Path, kind: str, calibration: tuple[str, int] | None = None,
               *extra: str, checkpoint_sha256: str | None = None, engine: str = 'torch') -> str:
    """A file name for what is derived from the model of ``cfg`` with ``checkpoint``: the checkpoint's stem,
    ``kind`` and a hash of everything that changes the result: the config's model section (after overrides; less
    ``train_cfg`` and ``test_cfg``, which no engine runs), the checkpoint's content (sha256), ``extra``, the
    versions of this package, torch and the packages ``engine``
    requires (``deploy.artifacts.package_versions``), and for ``calibration`` (source, number of images) the
    config's test dataloader with its pipeline and, for a folder, the content of its images. The same inputs give
    the same name, any change another. ``checkpoint_sha256``: the checkpoint's sha256 where the caller has it
    already (names for several kinds of one checkpoint read the file once)."""
    model = {k: v for k, v in cfg.model.to_dict().items() if k not in ('train_cfg', 'test_cfg')}
    key = dict(model=model, checkpoint=checkpoint_sha256 or file_sha256(checkpoint), kind=kind,
               extra=list(extra), versions=package_versions(ENGINES[engine].requires))
    if calibration is not None:
        source, num_images = calibration
        images = _calibration_source(source)[1]
        key['calibration'] = dict(source=source, images=num_images, loader=cfg.test_dataloader.to_dict(),
                                  content=None if images == 'val' else [
                                      (str(p.relative_to(source)), file_sha256(p)) for p in images])
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()[:16]
    return f'{checkpoint.stem}-{kind}-{digest}'


class _Batches:
    """The preprocessed input batches of ``calibration_batches``, made once, when first iterated."""

    def __init__(self, model: torch.nn.Module, cfg: Config, source: str | list[Path], num_images: int):
        self.model, self.cfg, self.source, self.num_images = model, cfg, source, num_images
        self._made: list[torch.Tensor] | None = None

    def __iter__(self):
        if self._made is None:
            with torch.no_grad():
                self._made = [self.model.data_preprocessor(batch, False)['inputs']
                              for batch, _ in calibration_batches(self.cfg, self.source, self.num_images)]
        return iter(self._made)


def calibrate(cfg: Config, checkpoint: str, source: str = 'val', num_images: int = 32) -> Path:
    """The fused engine's int8 input ranges for the model of ``cfg`` with ``checkpoint``, calibrated on
    ``num_images`` images of ``source`` ('val' or a folder) through this config's test pipeline: the path of the
    engine's saved artifact (a JSON file of ranges by layer), for ``config_request(cfg, 'fused', 'int8',
    input_ranges=...)``. Kept in ``weights_dir()/fused`` under ``cache_name`` and reused while everything it was
    derived from stays the same. The checkpoint is loaded strictly (``runner.load_checkpoint_strictly``, the
    tools' one route). A ValueError where the backbone is not ours, a FileNotFoundError without the checkpoint
    file."""
    from ..convert import weights_dir
    from ..deploy import prepare
    from ..deploy.artifacts import artifact_path
    if our_backbone(cfg) is None:
        raise ValueError(f'calibrate: the config\'s backbone is not one of ours ({", ".join(our_backbone_types())})')
    ckpt = Path(checkpoint).resolve()
    if not ckpt.is_file():
        raise FileNotFoundError(f'calibrate: no checkpoint file {checkpoint}')
    source, images = _calibration_source(source)
    prefix = weights_dir() / 'fused' / cache_name(cfg, ckpt, 'int8', (source, num_images), engine='fused')
    out = artifact_path(str(prefix), '.ranges.json')
    if not out.is_file():
        cfg = copy.deepcopy(cfg)
        cfg.work_dir = str(out.parent / 'work_dir')
        cfg.log_level = 'WARNING'
        cfg.load_from = None
        runner = build_runner(cfg)
        load_checkpoint_strictly(runner.model, str(ckpt))
        runner.model.eval()
        request = EngineRequest('fused', 'int8', calibration_source=source, calibration_images=num_images,
                                cache=str(prefix))
        prepare(runner.model.backbone, request, calibration=_Batches(runner.model, cfg, images, num_images))
    return out


def _cache_files(prefixes: Sequence[str]) -> dict[str, tuple[int, int]]:
    """The files under the cache name ``prefixes`` (``PREFIX.*``), in order, each with its (mtime, size): what tells
    a file read back from one written anew."""
    files = {}
    for prefix in prefixes:
        for p in sorted(Path(prefix).parent.glob(Path(prefix).name + '.*')):
            if str(p) not in files and p.is_file():
                stat = p.stat()
                files[str(p)] = (stat.st_mtime_ns, stat.st_size)
    return files


def engine_model(model: torch.nn.Module, cfg: Config, checkpoint: str | None,
                 request: EngineRequest) -> torch.nn.Module:
    """``model`` (a built model of ``cfg`` with ``checkpoint``'s weights, in evaluation mode from here on) as
    ``request`` asks, in place (``deploy.openmmlab.on_engine``): the backbone replaced, or backbone, neck and head
    attached as one engine module. int8 is calibrated on ``request.calibration_images`` of
    ``request.calibration_source`` (``calibration_batches``: 'val' or a folder), each batch through the model's own data
    preprocessor. Where the request names no cache and ``checkpoint`` is a file, what the engine derives (a
    conversion, calibrated ranges) is kept under ``weights_dir()/<engine>``, named by ``cache_name``, and read
    back next time; the line printed names the files read back ("loaded") and those written ("saved")."""
    from ..convert import weights_dir
    from ..deploy.openmmlab import on_engine
    engine, precision, keep_fp32 = request.engine, request.precision, request.keep_fp32
    model.eval()
    batches = None
    if precision in request.spec.calibrated:
        source, images = _calibration_source(request.calibration_source or 'val')
        batches = _Batches(model, cfg, images, request.calibration_images)
    ckpt = Path(checkpoint).resolve() if checkpoint else None
    if request.cache is None and request.float_cache is None and ckpt is not None and ckpt.is_file():
        folder = weights_dir() / engine
        calibrated = (source, request.calibration_images) if batches is not None else None
        digest = file_sha256(ckpt)
        request = request.filled(
            cache=str(folder / cache_name(cfg, ckpt, precision, calibrated, *sorted(keep_fp32),
                                          checkpoint_sha256=digest, engine=engine)),
            float_cache=str(folder / cache_name(cfg, ckpt, 'float', checkpoint_sha256=digest, engine=engine)))
    prefixes = [p for p in (request.cache, request.float_cache) if p]
    before = _cache_files(prefixes)
    on_engine(model, request, calibration=batches)
    after = _cache_files(prefixes)  # what this engine kept, its own first
    loaded = [p for p, stamp in after.items() if before.get(p) == stamp]
    saved = [p for p in after if p not in loaded]
    print(f'[engine] {type(model).__name__}: {request.spec.covers} on {engine} at {precision}'
          + (f', float32: {", ".join(keep_fp32)}' if keep_fp32 else '')
          + (f'; loaded: {", ".join(loaded)}' if loaded else '')
          + (f'; saved: {", ".join(saved)}' if saved else ''))
    return model


__all__ = ['DEFAULT_ENGINE', 'IMAGE_SUFFIXES', 'add_engine_args', 'cache_name', 'calibrate',
           'calibration_batches', 'config_request', 'default_engine', 'engine_request', 'engine_model',
           'kept_in_fp32']
