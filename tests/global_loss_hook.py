"""Test helper imported by training subprocesses (``custom_imports``, with tests/ on PYTHONPATH).

mmengine logs rank 0's loss only, the loss of its share of the batch; comparing one process with several
needs the loss of the whole global batch: the mean over ranks (each rank's loss is already a mean over its
equally sized share). Rank 0 appends it to WORK_DIR/global_loss.jsonl every iteration.
"""
import json
import os

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class GlobalLossRecorder(Hook):
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        loss = torch.as_tensor(outputs['loss'], dtype=torch.float64).detach().clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        if runner.rank == 0:
            with open(os.path.join(runner.work_dir, 'global_loss.jsonl'), 'a') as f:
                f.write(json.dumps(dict(iter=runner.iter + 1, loss=loss.item())) + '\n')
