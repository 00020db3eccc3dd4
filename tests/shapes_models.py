"""The demo's detector and segmentor configs built for the engine tests."""
import pytest
import torch


def shapes_model(config: str) -> torch.nn.Module:
    """The detector or segmentor of ``configs/shapes/<config>`` built with random weights (seed 0), in evaluation
    mode; skips where mmdet or mmseg is not installed."""
    from pathlib import Path
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    from mmengine.registry import init_default_scope

    from cpvt_backbones.adapters.runner import read_config
    cfg = read_config(str(Path(__file__).resolve().parents[1] / 'configs/shapes' / config))
    init_default_scope(cfg.default_scope)
    if cfg.default_scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    torch.manual_seed(0)
    return MODELS.build(cfg.model).eval()
