import functools
import json

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope='session', autouse=True)
def _pure_lookups_computed_once():
    """Two answers of mmengine's that depend only on their arguments and on files that do not change while the
    tests run, computed once per process (the configs read and the texts written are the same): the framework's
    model-index metafiles parsed for each ``mmdet::``/``mmseg::`` base of a config (``load`` in mmengine's
    ``_get_cfg_metainfo``), and the yapf formatting of a config (``Config.pretty_text``: logged, dumped to the
    work dir, stored in checkpoints), several times per Runner on the same text."""
    try:
        from mmengine.config import config, utils
    except ImportError:
        yield
        return
    load, load_path = utils.load, functools.cache(utils.load)
    format_code, formatted = config.FormatCode, {}

    def format_once(text, style_config=None, **kwargs):
        key = (text, json.dumps(style_config, sort_keys=True, default=repr), tuple(sorted(kwargs.items())))
        if key not in formatted:
            formatted[key] = format_code(text, style_config=style_config, **kwargs)
        return formatted[key]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, 'load', lambda file, *args, **kwargs: load_path(file)
                      if isinstance(file, str) and not args and not kwargs else load(file, *args, **kwargs))
        patch.setattr(config, 'FormatCode', format_once)
        yield


@pytest.fixture(scope='module')
def fake_fmnist(tmp_path_factory):
    """A Fashion-MNIST-shaped directory (``fake_fmnist.make_fake_fmnist``)."""
    from fake_fmnist import make_fake_fmnist
    return make_fake_fmnist(tmp_path_factory.mktemp('fmnist'))
