"""Building and launching mmengine's Runner for our train/test tools: the config (read, overridden, its parts we
look up), the Runner with the framework's known notices filtered, the checkpoint it loads (and that it must fit the
model), AMP and CPU multi-process launch."""
import contextlib
import copy
import gc
import itertools
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from mmengine.config import Config, DictAction

from ..convert.loading import (
    FAMILY_KEYS_SHOWN,
    CheckpointMismatchError,
    compare,
    family_mismatch,
    refuse_non_finite,
)
from ..utils import atomic_write, file_sha256

__all__ = ['ConfigError', 'KNOWN_LOG_LINES', 'KNOWN_WARNINGS', 'add_common_args', 'build_runner',
           'check_backbone_settings', 'check_option_keys', 'enable_amp',
           'checkpoint_state', 'evaluation_datasets', 'launched', 'load_checkpoint_strictly', 'load_config',
           'our_backbone', 'prepare_launch', 'quiet_known_warnings', 'read_config', 'refuse_unfit',
           'runner_checkpoint']

# Warnings mmengine, mmdet and mmseg print each time they build a model, a Runner or an inferencer, none about
# anything our tools or configs could change.
KNOWN_WARNINGS = (
    r'Failed to add <class .mmengine\.visualization\.vis_backend\.LocalVisBackend',  # inferencers without save_dir
    r'Default ``avg_non_ignore`` is False',                       # mmseg's CrossEntropyLoss default
    r'``build_loss`` would be deprecated soon',                   # mmseg's own heads
    r'The draw is False, it means that the hook for visualization',  # mmseg's hook, drawing off by default
)
# Log lines of mmengine's Runner that repeat in every run: the optimizer constructor's three lines for every
# parameter under a paramwise_cfg, its file-backend deprecation notices, mmseg's IoUMetric built without a prefix
# (at every evaluation), and the scope fallback for a dataloader's collate function.
KNOWN_LOG_LINES = ('paramwise_options -- ', '"FileClient" will be deprecated', '"HardDiskBackend" is the alias',
                   'The prefix is not set in metric class',
                   'registry tree. As a workaround, the current "function" registry')


def quiet_known_warnings() -> None:
    """Hide ``KNOWN_WARNINGS`` (our tools call this first); every other warning, ours included, still shows."""
    for message in KNOWN_WARNINGS:
        warnings.filterwarnings('ignore', message=message, category=UserWarning)


class _DropKnownLogLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(line in message for line in KNOWN_LOG_LINES)


_RUNNERS_BUILT = itertools.count()


def build_runner(cfg: Config):
    """mmengine's Runner for ``cfg`` (``cfg`` itself unchanged), the modules of its ``custom_imports`` imported
    first (as a config file's are when it is read; those added in memory, such as our hooks',
    ``custom_hooks.add_hook``), its logger without ``KNOWN_LOG_LINES`` (every other line still shows).

    Each Runner a process builds here has a logger, message hub and visualizer of its own, writing under its own
    ``work_dir``: the visualizer is named after the experiment (not the fixed name OpenMMLab's default runtimes
    give it), and every Runner after the first gets the experiment name ``<config name>-<n>`` unless the config
    sets ``experiment_name``."""
    # mmengine keeps these three per process by name and hands back an existing one whatever its save directory: a
    # fixed visualizer name, or two Runners of one config in the same second, would write into the first's folder.
    from mmengine.runner import Runner
    from mmengine.utils import import_modules_from_strings
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    cfg = copy.deepcopy(cfg)
    if isinstance(cfg.get('visualizer'), Mapping):
        cfg.visualizer.pop('name', None)
    built = next(_RUNNERS_BUILT)
    if built and cfg.get('experiment_name') is None:
        cfg.experiment_name = f'{Path(cfg.filename).stem if cfg.filename else "runner"}-{built}'
    runner = Runner.from_cfg(cfg)
    runner.logger.addFilter(_DropKnownLogLines())
    return runner


@contextlib.contextmanager
def _config_packages() -> Iterator[None]:
    """While the block runs, mmengine's ``MODULE2PACKAGE`` maps each importable module whose named distribution
    is absent to the distribution that provides it here; restored on the way out."""
    # mmengine finds a ``mmseg::`` base through the distribution that map names (``mmsegmentation``); the OneDL
    # forks install the same modules from others (``onedl-mmsegmentation``), so the base would be "not installed".
    from importlib.metadata import PackageNotFoundError, packages_distributions, version
    from importlib.util import find_spec

    from mmengine.config import utils
    saved = dict(utils.MODULE2PACKAGE)
    provided = None   # every installed distribution's modules: a scan of seconds, made only where one is needed
    for module, package in saved.items():
        try:
            version(package)
        except PackageNotFoundError:
            if find_spec(module) is None:
                continue
            provided = packages_distributions() if provided is None else provided
            if provided.get(module):
                utils.MODULE2PACKAGE[module] = provided[module][0]
    try:
        yield
    finally:
        utils.MODULE2PACKAGE.clear()
        utils.MODULE2PACKAGE.update(saved)


def read_config(path: str) -> Config:
    """``Config.fromfile(path)`` on every supported mmengine, the OneDL fork's included (``_config_packages``)."""
    with _config_packages():
        return Config.fromfile(str(path))


def load_config(path: str, cfg_options: dict | None = None, work_dir: str | None = None) -> Config:
    """Read a config (``read_config``), apply ``--cfg-options`` (``check_option_keys`` first), check our backbone's
    settings (``check_backbone_settings``) and choose ``work_dirs/<config name>`` unless given."""
    cfg = read_config(path)
    if cfg_options:
        check_option_keys(cfg, cfg_options, path)
        cfg.merge_from_dict(cfg_options)
    check_backbone_settings(cfg, path)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = str(Path('work_dirs') / Path(path).stem)
    return cfg


def check_option_keys(cfg: Config, cfg_options: Mapping, source: str = 'the config') -> None:
    """A ``ConfigError`` naming ``source`` and the fix for a ``--cfg-options`` key that goes on below a value of
    ``cfg`` that is neither a dict nor a list: most often a setting under ``model.backbone.arch`` where it is a
    model name (the fix: a dict with ``_delete_`` and ``base``). A key whose value is replaced first
    (``<prefix>._delete_=True``) passes."""
    for key in cfg_options:
        parts = key.split('.')
        node = cfg
        for depth, part in enumerate(parts[:-1]):
            if isinstance(node, (Config, Mapping)) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                break  # a new key, or an index mmengine refuses by name
            if isinstance(node, (Mapping, list)):
                continue
            prefix = '.'.join(parts[:depth + 1])
            if f'{prefix}._delete_' in cfg_options:
                break
            rest = '.'.join(parts[depth + 1:])
            if parts[depth] == 'arch' and isinstance(node, str):
                raise ConfigError(
                    f'{source}: --cfg-options {key}: {prefix} is the model name {node!r}, which has no setting '
                    f'{rest!r}; make it a dict based on that name: --cfg-options {prefix}._delete_=True '
                    f'{prefix}.base={node} {key}=...')
            raise ConfigError(
                f'{source}: --cfg-options {key}: {prefix} is {node!r} ({type(node).__name__}), not a dict, so it '
                f'has no {rest!r} to set; set {prefix} itself, or replace it with a dict: --cfg-options '
                f'{prefix}._delete_=True {key}=...')


def add_common_args(parser, launchers: Sequence[str] = ('none', 'pytorch', 'slurm', 'mpi')) -> None:
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries: key=value')
    parser.add_argument('--launcher', choices=launchers, default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def our_backbone_types() -> tuple[str, ...]:
    """The ``type`` names of our backbones in configs: those of ``adapters.backbones.BACKBONES``."""
    from .backbones import BACKBONES
    return tuple(BACKBONES)


def our_backbone(cfg: Config) -> dict | None:
    """The config's backbone settings if the backbone is one of ours (``our_backbone_types``), else None."""
    backbone = cfg.model.get('backbone') or {}
    return backbone if str(backbone.get('type', '')).rsplit('.', 1)[-1] in our_backbone_types() else None


class ConfigError(ValueError):
    """A config sets something our backbone does not take; the message lists what it takes."""


def check_backbone_settings(cfg: Config, source: str = 'the config') -> None:
    """A ``ConfigError`` naming ``source``, the unknown key(s) and the valid ones where our backbone's settings
    (``model.backbone``) or its ``arch`` dict hold one its constructor does not take; builds nothing."""
    import inspect

    from .. import models as core
    from ..models import model_settings
    from .backbones import BACKBONES
    settings = (cfg.get('model') or {}).get('backbone') or {}
    kind = str(settings.get('type', '')).rsplit('.', 1)[-1]
    if kind not in BACKBONES:
        return
    cls = BACKBONES[kind]
    valid = sorted(p for p in inspect.signature(cls.__init__).parameters if p != 'self')
    unknown = sorted(set(settings) - set(valid) - {'type'})
    if unknown:
        raise ConfigError(f'{source}: model.backbone ({kind}) has no setting(s) {unknown}; valid settings: {valid}')
    arch = settings.get('arch')
    if isinstance(arch, Mapping):
        try:
            model_settings(dict(arch), getattr(core, kind))
        except (TypeError, ValueError) as e:
            raise ConfigError(f'{source}: model.backbone.arch: {e}') from None


def evaluation_datasets(cfg: Config) -> Iterator[dict]:
    """The datasets the config evaluates on, those of its test and val dataloaders (test first), each the
    innermost one: the dataset with the pipeline, inside any wrapping dataset."""
    for loader in ('test_dataloader', 'val_dataloader'):
        if cfg.get(loader) is None:
            continue
        dataset = cfg[loader].dataset
        while 'pipeline' not in dataset:
            dataset = dataset.dataset
        yield dataset


def runner_checkpoint(cfg: Config, spec: str) -> str:
    """What mmengine's Runner loads (``load_from``) for a CHECKPOINT argument: an mmengine checkpoint as it is;
    for an mmpretrain config whose backbone is ours, also a model name with published weights, a URL or a bare
    weight file in any layout we read, written once as that classifier's checkpoint (``backbone.*``,
    ``head.fc.*``) beside the cached weights, under a name that carries the source file's sha256 (another file of
    the same name never reuses it)."""
    from ..convert import detect_layout, from_native, load_weights_file, resolve_checkpoint, to_native, weights_dir
    if cfg.get('default_scope') != 'mmpretrain' or our_backbone(cfg) is None:
        return spec
    path = resolve_checkpoint(spec, classifier=True)
    state = load_weights_file(path)
    if detect_layout(state) == 'classifier':
        return str(path)
    out = weights_dir() / 'classifiers' / f'{path.stem}-{file_sha256(path)[:16]}.mmpretrain.pth'
    if not out.is_file():
        atomic_write(out, lambda f: torch.save(dict(state_dict=from_native(to_native(state), 'classifier')), f))
    return str(out)


def checkpoint_state(checkpoint: Mapping) -> dict[str, torch.Tensor]:
    """The state dict of an mmengine checkpoint as mmengine's loaders read it: the one under ``state_dict`` (or the
    mapping itself), a leading ``module.`` stripped from each key (their default ``revise_keys``)."""
    state = checkpoint.get('state_dict', checkpoint)
    return {re.sub(r'^module\.', '', k): v for k, v in state.items()}


def refuse_unfit(model: torch.nn.Module, checkpoint: Mapping, source: str, allow_nonfinite: bool = False) -> None:
    """Raise ``CheckpointMismatchError`` naming ``source`` and listing every missing, unexpected and mis-shaped key
    (and value of a kind the model cannot take) where the mmengine checkpoint ``checkpoint`` (``checkpoint_state``)
    does not fit ``model`` exactly (``convert.loading.compare``), saying first where it holds another model family
    (``convert.loading.family_mismatch``); and, unless ``allow_nonfinite``, ``NonFiniteWeightsError`` naming every
    key whose values are NaN or Inf."""
    state = checkpoint_state(checkpoint)
    report = compare(model, state)
    if report:
        family = family_mismatch(model.state_dict(), state)
        raise CheckpointMismatchError(report, source, FAMILY_KEYS_SHOWN if family else None, family)
    if not allow_nonfinite:
        refuse_non_finite(state, model, source)


def load_checkpoint_strictly(model: torch.nn.Module, checkpoint: str, source: str | None = None,
                             allow_nonfinite: bool = False) -> None:
    """Load the mmengine checkpoint file ``checkpoint`` into the built ``model`` as mmengine's ``load_checkpoint``
    does (its reader: under the checkpoint opt-in ``safe_load``, and an empty, truncated or corrupt file a
    ``WeightFileError`` naming it), after ``refuse_unfit`` (``source``: how the errors name it, by default
    ``checkpoint <path>``): nothing is loaded from a checkpoint that does not fit exactly or holds NaN or Inf
    weights."""
    from mmengine.runner.checkpoint import _load_checkpoint, _load_checkpoint_to_model
    loaded = _load_checkpoint(checkpoint, map_location='cpu')
    refuse_unfit(model, loaded, source or f'checkpoint {checkpoint}', allow_nonfinite)
    _load_checkpoint_to_model(model, loaded, strict=True)


def enable_amp(cfg: Config) -> None:
    """Set ``cfg``'s optim wrapper, in place, to mmengine's AmpOptimWrapper (fp16; loss scale 'dynamic' unless
    set); a SystemExit without a GPU (mmengine 0.10.7 runs it only on CUDA/NPU/MLU)."""
    if not torch.cuda.is_available():
        raise SystemExit('--amp needs a GPU: mmengine 0.10.7 runs AmpOptimWrapper only on CUDA/NPU/MLU devices')
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')


def prepare_launch(cfg: Config, launcher: str) -> None:
    """Set ``cfg.launcher``; without a GPU and with ``launcher='pytorch'``, make ``cfg`` run DDP on the CPU (gloo,
    ``device_ids=None``) and start the process group now, from ``RANK`` and ``WORLD_SIZE``, so that mmengine
    skips its own init. Another launcher without a GPU: a SystemExit."""
    # mmengine's own set-up calls torch.cuda.set_device and gives DDP device_ids=[LOCAL_RANK]: both fail on CPU.
    cfg.launcher = launcher
    if launcher == 'none' or torch.cuda.is_available():
        return
    if launcher != 'pytorch':
        raise SystemExit(f'launcher {launcher!r} needs GPUs here; on CPU use torchrun (--launcher pytorch)')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    wrapper.setdefault('type', 'MMDistributedDataParallel')
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                                world_size=int(os.environ['WORLD_SIZE']))


@contextlib.contextmanager
def launched(cfg: Config, launcher: str):
    """``prepare_launch``, then on the way out: where the block ended without an error, a garbage collection and
    a barrier of all ranks; on any exit, the process group destroyed."""
    # A gloo group left to the interpreter's exit can abort a rank after the work is done ("terminate called
    # without an active exception"). The runner (in reference cycles) holds the group through its DDP wrapper:
    # collected first. No barrier after an error: a peer may never come.
    prepare_launch(cfg, launcher)
    try:
        yield
        if dist.is_initialized():
            gc.collect()
            dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
