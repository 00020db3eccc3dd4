"""``RNGStateHook``: resume with the random state an uninterrupted run would have had. ``InferenceEngineHook``:
test with the model on an inference engine.

mmengine's resume restores weights, optimizer, schedulers and the data position (the loop replays the
dataloader up to the resumed iteration, so the pipeline redraws its numpy/random numbers exactly), but not
torch's global generator, which stochastic depth and dropout draw from: after a resume they would draw
different masks. This hook stores that state in every checkpoint and sets it back just before the first
iteration after a resume (after the replay, which does not use it); a checkpoint loaded to start another run
(``load_from``, which begins at iteration 0) leaves the generator alone. Each process restores the state of
rank 0, the one that wrote the checkpoint; with mmengine's default ``diff_rank_seed=False`` all ranks' states
are equal anyway.
"""
from typing import Optional, Sequence

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RNGStateHook(Hook):
    priority = 'VERY_LOW'

    def __init__(self):
        self._pending: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = dict(torch=torch.get_rng_state())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint['rng_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = checkpoint.get('rng_state')
        self._pending = None if state is None else dict(state, iter=checkpoint.get('meta', {}).get('iter'))

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._pending is None or self._pending['iter'] != runner.iter:
            return
        torch.set_rng_state(self._pending['torch'])
        cuda = self._pending.get('cuda')
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        self._pending = None


@HOOKS.register_module()
class InferenceEngineHook(Hook):
    """Before the test loop (after the runner has loaded the checkpoint), run the model's backbone, neck and head
    on ``engine`` at ``precision`` (``adapters.engines.engine_model``: 'openvino', or 'torch' in bf16 under
    autocast; OpenVINO's int8 calibrated on ``calibration_images`` of ``calibration``: 'val' or a folder; the
    modules named in ``keep_fp32`` stay float32). ``tools/test.py --engine openvino`` and ``--precision bf16``
    add it (``adapters.engines.set_engine``)."""

    def __init__(self, engine: str = 'openvino', precision: str = 'fp32', calibration: Optional[str] = None,
                 calibration_images: int = 32, keep_fp32: Sequence[str] = ()):
        self.engine, self.precision, self.calibration = engine, precision, calibration
        self.calibration_images, self.keep_fp32 = calibration_images, tuple(keep_fp32)

    def before_test(self, runner) -> None:
        from .engines import engine_model
        model = getattr(runner.model, 'module', runner.model)
        engine_model(model, runner.cfg, runner.cfg.get('load_from'), self.engine, self.precision,
                     self.calibration, self.calibration_images, self.keep_fp32)
