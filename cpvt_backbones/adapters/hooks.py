"""Our mmengine hooks, registered in mmengine's ``HOOKS`` when this module is imported (the opt-in a config's
``custom_imports`` makes): ``RNGStateHook`` resumes with the random state an uninterrupted run would have had;
``NonFiniteLossHook`` stops at the first non-finite loss, keeping every finite checkpoint; ``InferenceEngineHook``
tests with the model on an inference engine; ``StrictLoadHook`` refuses a checkpoint that does not fit the model;
``PredictAloneHook`` predicts each image of a padded batch as if it were alone.
"""
import random
from collections.abc import Callable, Mapping
from functools import partial

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..deploy.registry import EngineRequest
from .runner import refuse_unfit


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Stores torch's, numpy's and Python's generators in every checkpoint and sets them back on resume, so the run
    continues as an uninterrupted one would: numpy's and Python's (the data pipeline's) just before the first new
    batch is drawn, after any replay of the dataloader, torch's (stochastic depth, dropout, the dataloader's base
    seed) just after; each process restores rank 0's state. A checkpoint loaded to start another run
    (``load_from``) leaves the generators alone. Why both moments: docs/compatibility.md (resume)."""
    priority = 'VERY_LOW'

    def __init__(self):
        self._pending: dict | None = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        state = dict(torch=torch.get_rng_state(), numpy=(name, torch.from_numpy(keys.astype(np.int64)), pos,
                                                          has_gauss, gauss), python=random.getstate())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint['rng_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = checkpoint.get('rng_state')
        self._pending = None if state is None else dict(state, iter=checkpoint.get('meta', {}).get('iter'))

    def before_train(self, runner) -> None:
        if self._pending is None or self._pending['iter'] != runner.iter:
            self._pending = None
            return
        loop = runner.train_loop
        if hasattr(loop, 'dataloader_iterator') and 'numpy' in self._pending:  # iteration-based
            loop.dataloader_iterator = _BeforeFirstBatch(loop.dataloader_iterator, runner.iter,
                                                         getattr(loop, 'fast_forward_on_resume', False),
                                                         partial(_set_data_generators, self._pending))

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """torch's generator after the batch is drawn: making a dataloader iterator draws its base seed from it,
        which the OneDL loop does again after skipping ahead."""
        if self._pending is None or self._pending['iter'] != runner.iter:
            return
        state, self._pending = self._pending, None
        torch.set_rng_state(state['torch'])
        cuda = state.get('cuda')
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _set_data_generators(state: dict) -> None:
    """numpy's and Python's generators, which the data pipeline draws from, as ``state`` holds them."""
    name, keys, pos, has_gauss, gauss = state['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state['python'])


class _BeforeFirstBatch:
    """A training loop's dataloader iterator that calls ``restore`` just before it draws the first batch after a
    resume:
    after the ``resumed_iter`` batches that mmengine 0.10.7 replays, or at once where the loop skips ahead through
    ``skip_iter`` (the OneDL fork) or not at all (``fast_forward_on_resume``)."""

    def __init__(self, inner, resumed_iter: int, fast_forward: bool, restore: Callable[[], None]):
        self._inner, self._restore = inner, restore
        self._replays = 0 if fast_forward or hasattr(inner, 'skip_iter') else resumed_iter

    def skip_iter(self, num_iters: int) -> None:
        self._replays = 0
        self._inner.skip_iter(num_iters)

    def __iter__(self):
        return self

    def __next__(self):
        if self._replays:
            self._replays -= 1
        elif self._restore is not None:
            self._restore()
            self._restore = None
        return next(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop training at the first iteration whose loss is NaN or Inf, before that iteration's checkpoint is written
    (so no checkpoint with the damaged weights exists and ``max_keep_ckpts`` prunes none of the finite ones), with
    an error naming the iteration and the loss terms; and never write a checkpoint whose weights are not finite
    (a step can damage the weights while its own loss was still finite)."""
    priority = 'ABOVE_NORMAL'  # before CheckpointHook (VERY_LOW) in after_train_iter

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        terms = {k: float(v.detach()) for k, v in (outputs or {}).items()
                 if isinstance(v, torch.Tensor) and v.numel() == 1 and 'loss' in k}
        bad = {k: v for k, v in terms.items() if not np.isfinite(v)}
        if bad:
            raise FloatingPointError(f'non-finite loss at iteration {runner.iter + 1} ({bad}): training stopped '
                                     'before saving; lower the learning rate or check the data, then resume from '
                                     'the last checkpoint')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        bad = [k for k, v in checkpoint.get('state_dict', {}).items()
               if isinstance(v, torch.Tensor) and v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise FloatingPointError(f'refusing to save a checkpoint at iteration {runner.iter + 1}: '
                                     f'{len(bad)} weight tensor(s) are not finite ({", ".join(bad[:4])})')


@HOOKS.register_module()
class InferenceEngineHook(Hook):
    """Before the test loop (after the runner has loaded the checkpoint), put the model on an inference engine as
    ``request`` asks (``adapters.engines.engine_model``, the one route to an engine): a ``deploy.EngineRequest``
    (tools/test.py's, ``custom_hooks.set_engine``), or in a config file the dict of its fields
    (``request=dict(engine='openvino', precision='int8')``), made into one here. A request whose caches are None
    is kept under names ``engine_model`` gives by content."""

    def __init__(self, request: 'EngineRequest | Mapping'):
        self.request = request if isinstance(request, EngineRequest) else EngineRequest(**request)

    def before_test(self, runner) -> None:
        from .engines import engine_model
        model = getattr(runner.model, 'module', runner.model)
        engine_model(model, runner.cfg, runner.cfg.get('load_from'), self.request)


@HOOKS.register_module()
class StrictLoadHook(Hook):
    """Refuse a checkpoint that does not fit the model, which mmengine's Runner would load non-strictly: before
    it is loaded, raise ``CheckpointMismatchError`` (``adapters.runner.refuse_unfit``) naming the checkpoint and
    the config; NaN or Inf weights too, by key, unless ``allow_nonfinite``. ``custom_hooks.strict_checkpoint``
    adds it (``tools/test.py``, ``evaluation.evaluate``)."""
    priority = 'VERY_HIGH'

    def __init__(self, allow_nonfinite: bool = False):
        self.allow_nonfinite = allow_nonfinite

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = getattr(runner.model, 'module', runner.model)
        refuse_unfit(model, checkpoint, f'checkpoint {runner.cfg.get("load_from")} (config {runner.cfg.filename})',
                     self.allow_nonfinite)


@HOOKS.register_module()
class PredictAloneHook(Hook):
    """Before the validation and test loops, make the model predict each image of a padded batch as it predicts
    that image alone (``adapters.alone.predict_alone``), so that scores do not depend on the batch size or on
    which images share a batch. It needs a data preprocessor that hands over the images' valid sizes
    (``ValidSizeDetDataPreprocessor`` or ``ValidSizeSegDataPreprocessor``) and refuses, by name, a model
    without one."""

    def _apply(self, runner) -> None:
        from .alone import predict_alone
        model = getattr(runner.model, 'module', runner.model)
        preprocessor = getattr(model, 'data_preprocessor', None)
        if not getattr(preprocessor, 'marks_valid_sizes', False):
            raise ValueError(f'PredictAloneHook: the data preprocessor {type(preprocessor).__name__} does not hand '
                             "the model its images' valid sizes; set model.data_preprocessor.type to "
                             "'ValidSizeDetDataPreprocessor' (mmdet) or 'ValidSizeSegDataPreprocessor' (mmseg)")
        predict_alone(model)

    def before_val(self, runner) -> None:
        self._apply(runner)

    def before_test(self, runner) -> None:
        self._apply(runner)
