"""What the tools need to run a config's model on an inference engine: the precision options, calibration on
the config's own test pipeline, and the OpenVINO engine for a whole detector or segmentor.

Engines (``ENGINES``): 'torch', in float32 and int8 our backbones through ``cpvt_backbones.optimize`` (the rest
of the model in PyTorch float32), in bf16 backbone + neck + head under autocast (``deploy.openmmlab.
to_autocast_model``); 'openvino', backbone + neck + head on OpenVINO (``deploy.openmmlab.to_openvino_model``).
Both keep the data preprocessor and post-processing in the framework's Python, in float32. Precisions are
``deploy.PRECISIONS`` for both. The engines
themselves are in ``deploy`` and need torch only; what is here works on an mmengine config (its backbone, its
test pipeline, its test loop's hooks), so it sits with the adapters. ``adapters.evaluation`` runs the config's
test loop on either engine.
"""
import argparse
import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import warnings
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.config import Config

from ..deploy import PRECISIONS
from ..utils import atomic_write, file_sha256
from .runner import build_runner, evaluation_datasets, our_backbone

ENGINES = ('torch', 'openvino')
IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def optimize_backbone(cfg: Config, precision: str = 'fp32', input_ranges: Optional[str] = None,
                      keep_fp32: Sequence[str] = ()) -> bool:
    """Have the config build its backbone through ``cpvt_backbones.optimize`` (the fused CPU inference path) in
    ``precision`` ('fp32' or 'int8'; int8 static with ``input_ranges``, a file from ``calibrate``) if the
    backbone is one of ours; returns whether it is. ``keep_fp32``: the model's module names left in float32;
    those under ``backbone.`` reach ``optimize`` (the torch engine runs the rest of the model in float32)."""
    backbone = our_backbone(cfg)
    if backbone is not None:
        backbone['optimize'] = dict(precision=precision)
        if input_ranges is not None:
            backbone['optimize']['input_ranges'] = str(input_ranges)
        inside = [p[len('backbone.'):] for p in keep_fp32 if p.startswith('backbone.')]
        if inside:
            backbone['optimize']['keep_fp32'] = inside
    return backbone is not None


def add_precision_args(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--plain``, ``--precision``, ``--calibrate`` and ``--calibrate-images`` (tools/test.py,
    tools/infer.py)."""
    parser.add_argument('--engine', choices=ENGINES, default='torch',
                        help='torch: our backbone optimized, the rest in PyTorch (bf16: backbone, neck and head '
                             'under autocast); openvino: backbone, neck and head on OpenVINO (pre- and '
                             'post-processing in Python)')
    parser.add_argument('--plain', action='store_true', help='torch engine: do not optimize our backbone')
    parser.add_argument('--precision', choices=PRECISIONS, default='fp32', help='fp32, bf16 or int8')
    parser.add_argument('--calibrate', metavar='IMAGES',
                        help="int8 calibration images: 'val' (the config's test set, the default) or a folder of "
                             "images, through the config's test pipeline; the result is saved and reused (torch: "
                             'activation ranges; openvino: the NNCF-quantized model)')
    parser.add_argument('--calibrate-images', type=int, default=32, metavar='N', help='images calibrated on')
    parser.add_argument('--keep-fp32', nargs='*', metavar='MODULE',
                        help="int8: modules of the model (names as in named_modules, e.g. bbox_head.retina_cls) "
                             "whose layers stay float32; default: the config's int8_keep_fp32; none given: none")


def apply_precision(cfg: Config, args: argparse.Namespace, checkpoint: str) -> None:
    """What ``add_precision_args`` asked for, on ``cfg`` (``set_engine``; the torch engine's int8 calibrated
    with ``checkpoint`` first, or the saved ranges reused)."""
    if (args.calibrate or args.keep_fp32 is not None) and args.precision != 'int8':
        raise SystemExit('--calibrate and --keep-fp32 configure int8: use them with --precision int8')
    if args.plain:
        if args.engine == 'openvino':
            raise SystemExit('--plain keeps the plain PyTorch backbone; it does not apply to --engine openvino')
        if args.precision != 'fp32':
            raise SystemExit('--plain keeps the plain float32 model: no --precision with it')
        return
    calibration = (args.calibrate or 'val') if args.precision == 'int8' else None
    ranges = None
    if args.engine == 'torch' and args.precision == 'int8':
        ranges = calibrate(cfg, checkpoint, calibration, args.calibrate_images)
        print(f'[calibrate] activation ranges: {ranges}')
    set_engine(cfg, args.engine, args.precision, ranges, calibration, args.calibrate_images,
               kept_in_fp32(cfg, args.keep_fp32) if args.precision == 'int8' else ())


def set_engine(cfg: Config, engine: str = 'torch', precision: str = 'fp32', input_ranges: Optional[str] = None,
               calibration: Optional[str] = None, calibration_images: int = 32,
               keep_fp32: Sequence[str] = ()) -> None:
    """Have the model of ``cfg`` run on ``engine`` at ``precision``: the torch engine in float32 or int8 through
    its optimized backbone (``optimize_backbone``; int8 static at ``input_ranges``); the torch engine in bf16
    and the OpenVINO engine through ``InferenceEngineHook``, which attaches the engine once the test loop has
    loaded the checkpoint (``engine_model``; OpenVINO's int8 calibrated on ``calibration_images`` of
    ``calibration``). int8 leaves the modules named in ``keep_fp32`` in float32."""
    if engine not in ENGINES:
        raise ValueError(f'engine must be one of {ENGINES}, got {engine!r}')
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, got {precision!r}')
    if engine == 'torch' and precision != 'bf16':
        optimize_backbone(cfg, precision, input_ranges, keep_fp32)
        return
    imports = cfg.get('custom_imports') or dict(imports=[], allow_failed_imports=False)
    if 'cpvt_backbones.adapters.hooks' not in imports['imports']:
        cfg.custom_imports = dict(imports, imports=list(imports['imports']) + ['cpvt_backbones.adapters.hooks'])
    hooks = [h for h in cfg.get('custom_hooks', []) if h.get('type') != 'InferenceEngineHook']
    cfg.custom_hooks = hooks + [dict(type='InferenceEngineHook', engine=engine, precision=precision,
                                     calibration=calibration if precision == 'int8' else None,
                                     calibration_images=calibration_images, keep_fp32=list(keep_fp32))]


def kept_in_fp32(cfg: Config, keep_fp32: Optional[Sequence[str]] = None) -> Tuple[str, ...]:
    """The modules that int8 leaves in float32: ``keep_fp32`` where given (an empty list: none), else the
    config's ``int8_keep_fp32`` (module names of its model, such as 'bbox_head.retina_cls': the layers whose
    quantization measured costly, ``benchmarks/int8_scope.py``)."""
    return tuple(cfg.get('int8_keep_fp32', ()) if keep_fp32 is None else keep_fp32)


def _calibration_source(source: str) -> Tuple[str, Union[str, List[Path]]]:
    """('val', 'val'), or a folder's resolved path and its images (sorted), refused by name when there are
    none."""
    if source == 'val':
        return source, source
    folder = Path(source)
    if not folder.is_dir():
        raise ValueError(f"calibration: the source must be 'val' or a folder of images, got {source!r}")
    images = sorted(p for p in folder.rglob('*') if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise ValueError(f'calibration: no images ({", ".join(IMAGE_SUFFIXES)}) under {folder}')
    return str(folder.resolve()), images


def calibration_batches(cfg: Config, source: Union[str, List[Path]], num_images: int) -> Iterator[Tuple[dict, int]]:
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


def _image_batches(pipeline, images: List[Path]) -> Iterator[Tuple[dict, int]]:
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


def _versions(*packages: str) -> dict:
    return {name: importlib.metadata.version(name) for name in packages}


def cache_name(cfg: Config, checkpoint: Path, kind: str, calibration: Optional[Tuple[str, int]] = None,
               *extra: str) -> str:
    """A file name for what is derived from the model of ``cfg`` with ``checkpoint``: the checkpoint's stem,
    ``kind`` and a hash of everything that changes the result: the config's model section (after overrides), the
    checkpoint's content (sha256), ``extra``, the versions of this package, torch, OpenVINO and NNCF where
    installed, and for ``calibration`` (source, number of images) the config's test dataloader with its
    pipeline and, for a folder, the content of its images. The same inputs give the same name, any change
    another."""
    key = dict(model=cfg.model.to_dict(), checkpoint=file_sha256(checkpoint), kind=kind, extra=list(extra),
               versions=_versions(*(name for name in ('cpvt_backbones', 'torch', 'openvino', 'nncf')
                                    if importlib.util.find_spec(name) is not None)))
    if calibration is not None:
        source, num_images = calibration
        images = _calibration_source(source)[1]
        key['calibration'] = dict(source=source, images=num_images, loader=cfg.test_dataloader.to_dict(),
                                  content=None if images == 'val' else [
                                      (str(p.relative_to(source)), file_sha256(p)) for p in images])
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()[:16]
    return f'{checkpoint.stem}-{kind}-{digest}'


def calibrate(cfg: Config, checkpoint: str, source: str = 'val', num_images: int = 32) -> Path:
    """Static int8 calibration: the input ranges of the backbone's linear layers (``record_input_ranges``) while
    the plain model of ``cfg`` with ``checkpoint`` runs on ``num_images`` images of ``source`` ('val': the
    config's test set, in order; or a folder of images, sorted, through the test pipeline without its
    annotation steps, unreadable ones skipped), as a JSON file for ``optimize_backbone(cfg, 'int8',
    input_ranges=...)``. The file is kept in ``weights_dir()/calibration`` under ``cache_name`` and reused while
    everything it was derived from stays the same."""
    from mmengine.runner import load_checkpoint

    from ..convert import weights_dir
    from ..deploy import record_input_ranges
    if our_backbone(cfg) is None:
        raise ValueError('calibrate: the config\'s backbone is not one of ours (PyramidCPVT or CPVT)')
    ckpt = Path(checkpoint).resolve()
    if not ckpt.is_file():
        raise FileNotFoundError(f'calibrate: no checkpoint file {checkpoint}')
    source, images = _calibration_source(source)
    out = weights_dir() / 'calibration' / f'{cache_name(cfg, ckpt, "ranges", (source, num_images))}.json'
    if out.is_file():
        return out
    cfg = copy.deepcopy(cfg)
    cfg.work_dir = str(out.parent / 'work_dir')
    cfg.log_level = 'WARNING'
    cfg.load_from = None
    our_backbone(cfg).pop('optimize', None)  # calibration runs the plain model (its layers are called)
    runner = build_runner(cfg)
    load_checkpoint(runner.model, str(ckpt), map_location='cpu', revise_keys=[(r'^module\.', '')])
    runner.model.eval()
    seen = 0
    with record_input_ranges(runner.model.backbone) as ranges:
        for batch, size in calibration_batches(cfg, images, num_images):
            runner.model.test_step(batch)
            seen += size
    record = dict(checkpoint=str(ckpt), source=source, images=seen, input_ranges=ranges)
    atomic_write(out, json.dumps(record, indent=1).encode())
    return out


def engine_model(model: torch.nn.Module, cfg: Config, checkpoint: Optional[str], engine: str = 'torch',
                 precision: str = 'fp32', calibration: Optional[str] = None, calibration_images: int = 32,
                 keep_fp32: Sequence[str] = ()) -> torch.nn.Module:
    """``model`` (a built detector or segmentor of ``cfg`` with ``checkpoint``'s weights, in evaluation mode
    from here on) on ``engine`` at ``precision``, in place: OpenVINO through ``openvino_model``; the torch
    engine's bf16 under autocast (``deploy.openmmlab.to_autocast_model``). The torch engine's float32 and int8
    are the config's optimized backbone (``set_engine``), so ``model`` is returned as it is."""
    from ..deploy.openmmlab import to_autocast_model
    model.eval()
    if engine == 'openvino':
        return openvino_model(model, cfg, checkpoint, precision, calibration, calibration_images, keep_fp32)
    if precision == 'bf16':
        print(f'[torch] {type(model).__name__}: backbone, neck and head under bf16 autocast')
        return to_autocast_model(model, precision)
    return model


def openvino_model(model: torch.nn.Module, cfg: Config, checkpoint: Optional[str], precision: str = 'fp32',
                   calibration: Optional[str] = None, calibration_images: int = 32,
                   keep_fp32: Sequence[str] = ()) -> torch.nn.Module:
    """``model`` (a built detector or segmentor of ``cfg`` with ``checkpoint``'s weights) running on OpenVINO,
    in place. int8 is calibrated on ``calibration_images`` of ``calibration`` (see ``calibration_batches``),
    each batch through the model's own data preprocessor, with the modules named in ``keep_fp32`` left in
    float32. With a checkpoint file, the converted model is saved under ``weights_dir()/openvino`` named by
    ``cache_name`` (the config's model section, the checkpoint's content, the precision, the calibration,
    ``keep_fp32`` and the versions) and read from there next time after its own checksums are checked
    (``deploy.openvino.to_openvino``); int8 quantizes the saved float32 conversion of the same model where there
    is one."""
    from ..convert import weights_dir
    from ..deploy.openmmlab import to_openvino_model
    from ..deploy.openvino import saved_problem
    model.eval()
    inputs, (source, images) = None, ('', None)
    if precision == 'int8':
        source, images = _calibration_source(calibration or 'val')
    ckpt = Path(checkpoint).resolve() if checkpoint else None
    cache = float_cache = None
    if ckpt is not None and ckpt.is_file():
        folder = weights_dir() / 'openvino'
        float_cache = folder / f'{cache_name(cfg, ckpt, "float")}.xml'
        cache = float_cache if precision != 'int8' else \
            folder / f'{cache_name(cfg, ckpt, "int8", (source, calibration_images), *sorted(keep_fp32))}.xml'
    if precision == 'int8':
        if not (cache and saved_problem(cache) is None):  # nothing usable saved: calibrate
            with torch.no_grad():
                inputs = [model.data_preprocessor(batch, False)['inputs']
                          for batch, _ in calibration_batches(cfg, images, calibration_images)]
    print(f'[openvino] {type(model).__name__} at {precision}' + (f', float32: {", ".join(keep_fp32)}' if keep_fp32
                                                                 else '') + (f', saved as {cache}' if cache else ''))
    return to_openvino_model(model, precision, calibration=inputs, keep_fp32=keep_fp32,
                             cache=str(cache) if cache else None, float_cache=str(float_cache) if float_cache else None)


__all__ = ['ENGINES', 'IMAGE_SUFFIXES', 'add_precision_args', 'apply_precision', 'cache_name', 'calibrate',
           'calibration_batches',
           'engine_model', 'kept_in_fp32', 'openvino_model', 'optimize_backbone', 'set_engine']
