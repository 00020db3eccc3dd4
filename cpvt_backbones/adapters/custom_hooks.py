"""Our hooks asked for in a config: each put among the config's ``custom_hooks``, its module (``adapters.hooks``) among
its ``custom_imports``, which ``runner.build_runner`` imports, registering the hooks, when the runner is built. Only
this module names the hooks module: nothing the hooks import comes back here.
"""
import argparse

from mmengine.config import Config

from ..deploy.registry import EngineRequest
from .engines import engine_request
from .runner import runner_checkpoint

HOOKS_MODULE = 'cpvt_backbones.adapters.hooks'


def add_hook(cfg: Config, hook: dict) -> None:
    """``hook`` among the config's ``custom_hooks``, in place of any of the same type, and ``HOOKS_MODULE`` among its
    ``custom_imports``."""
    imports = cfg.get('custom_imports') or dict(imports=[], allow_failed_imports=False)
    if HOOKS_MODULE not in imports['imports']:
        cfg.custom_imports = dict(imports, imports=list(imports['imports']) + [HOOKS_MODULE])
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks', []) if h.get('type') != hook['type']] + [hook]


def strict_checkpoint(cfg: Config, checkpoint: str, allow_nonfinite: bool = False) -> None:
    """Have the runner of ``cfg`` load ``checkpoint`` (``load_from``: ``runner.runner_checkpoint``, which also
    takes published weights by name for our classifiers) and refuse it, before its weights are loaded, where it
    does not fit the model exactly or (unless ``allow_nonfinite``) holds NaN or Inf weights (``StrictLoadHook``:
    ``runner.refuse_unfit``, naming the checkpoint and the config). The one way our tools give a runner a
    checkpoint (``tools/test.py``; ``evaluation.evaluate``, hence ``tools/eval_sizes.py``, the demo and the
    benchmarks); the inferencers' way is ``inference.StrictWeights``, a built model's
    ``runner.load_checkpoint_strictly``, all three refusing through ``refuse_unfit``. An empty, truncated or
    corrupt file is a ``WeightFileError`` naming it when the runner reads it (the checkpoint opt-in,
    ``adapters.checkpoint``)."""
    cfg.load_from = runner_checkpoint(cfg, checkpoint)
    add_hook(cfg, dict(type='StrictLoadHook', **(dict(allow_nonfinite=True) if allow_nonfinite else {})))


def set_engine(cfg: Config, request: EngineRequest) -> None:
    """Have the test loop of ``cfg`` run its model as ``request`` asks (``adapters.engines.config_request``): an
    ``InferenceEngineHook`` holding the request, which takes ``adapters.engines.engine_model`` once the checkpoint
    is loaded."""
    add_hook(cfg, dict(type='InferenceEngineHook', request=request))


def use_engine(cfg: Config, args: argparse.Namespace) -> None:
    """``set_engine`` with what ``adapters.engines.add_engine_args`` asked for (``engine_request``)."""
    set_engine(cfg, engine_request(cfg, args))


__all__ = ['HOOKS_MODULE', 'add_hook', 'set_engine', 'strict_checkpoint', 'use_engine']
