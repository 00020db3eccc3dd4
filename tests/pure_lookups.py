"""Two answers of mmengine's that depend only on their arguments and on files that do not change while the tests
run, computed once instead of on every call: the framework's model-index metafiles parsed for each
``mmdet::``/``mmseg::`` base of a config (``load`` in mmengine's ``_get_cfg_metainfo``), and the yapf formatting of
a config (``Config.pretty_text``: logged, dumped to the work dir, stored in checkpoints), several times per Runner
on the same text. The answers are the same as without the cache; only the time differs."""
import functools
import hashlib
import json
import os
from pathlib import Path


def install(folder=None):
    """Patch mmengine (if installed) to compute each lookup once: in this process's memory, and the formatting
    also in ``folder`` (one file per text, shared by every process given the same folder). Returns a function
    that undoes the patch."""
    try:
        from mmengine.config import config, utils
    except ImportError:
        return lambda: None
    load, load_path = utils.load, functools.cache(utils.load)
    format_code, formatted = config.FormatCode, {}
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)

    def format_once(text, style_config=None, **kwargs):
        key = json.dumps([text, style_config, sorted(kwargs.items())], sort_keys=True, default=repr)
        if key in formatted:
            return formatted[key]
        file = folder and Path(folder) / f'{hashlib.sha256(key.encode()).hexdigest()}.json'
        if file and file.exists():
            formatted[key] = tuple(json.loads(file.read_text()))
            return formatted[key]
        formatted[key] = format_code(text, style_config=style_config, **kwargs)
        if file:
            partial = file.with_suffix(f'.{os.getpid()}.tmp')
            partial.write_text(json.dumps(formatted[key]))
            os.replace(partial, file)
        return formatted[key]

    def load_once(file, *args, **kwargs):
        return load_path(file) if isinstance(file, str) and not args and not kwargs else load(file, *args, **kwargs)

    utils.load, config.FormatCode = load_once, format_once

    def undo():
        utils.load, config.FormatCode = load, format_code
    return undo
