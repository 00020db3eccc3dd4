"""Write docs/reference.md, the constructors' argument reference, from the models' ``Args:`` docstrings.

    python tools/reference_docs.py

The docstrings are the one place the arguments are described; this renders them for the docs
(tests/test_reference_docs.py fails when the page and the docstrings disagree). The page's last part, from the
``HANDWRITTEN`` heading on, is written by hand: every rendering keeps it as the page has it.
"""
import inspect
import re
from pathlib import Path

from cpvt_backbones.models import CPVT, MODEL_SPECS, PVTv2, Pyramid, PyramidCPVT, TwinsSVT
from cpvt_backbones.models.base import CPVTBase
from cpvt_backbones.utils import atomic_write

PAGE = Path(__file__).resolve().parents[1] / 'docs' / 'reference.md'
HANDWRITTEN = '## Outputs against timm, the Twins release and mmseg'


def documented_arguments(doc: str) -> dict[str, str]:
    """``{name: description}`` of a Google-style ``Args:`` section (continuation lines joined)."""
    lines = inspect.cleandoc(doc).splitlines()
    start = lines.index('Args:') + 1
    args: dict[str, str] = {}
    name = None
    for line in lines[start:]:
        if not line.strip():
            break
        entry = re.match(r'    (\*\*\w+|\w+): (.*)', line)
        if entry:
            name = entry.group(1)
            args[name] = entry.group(2)
        elif line.startswith('        ') and name is not None:
            args[name] += ' ' + line.strip()
        else:
            break
    return args


def documented(cls) -> dict[str, str]:
    """Every argument ``cls.argument_names()`` lists, with its text from the ``__init__`` docstring of the class
    that takes it (the class's own first, then its parents' that ``**kwargs`` passes on)."""
    args: dict[str, str] = {}
    for klass in cls.__mro__:
        if '__init__' not in vars(klass):
            continue
        own = documented_arguments(klass.__init__.__doc__)
        args |= {name: text for name, text in own.items() if name not in args}
        if '**kwargs' not in own:
            break
    return args


def _table(args: dict[str, str], defaults: dict[str, object]) -> str:
    rows = ['| argument | default | meaning |', '|---|---|---|']
    for name, text in args.items():
        if name.startswith('**'):
            continue
        default = defaults.get(name, inspect.Parameter.empty)
        shown = '' if default is inspect.Parameter.empty else f'`{_show(default)}`'
        rows.append(f'| `{name}` | {shown} | {text} |')
    return '\n'.join(rows)


def _show(value) -> str:
    if inspect.isclass(value):
        return f'{value.__module__.replace("torch.nn.modules", "nn").split(".")[0]}.{value.__name__}' \
            if value.__module__.startswith('torch') else value.__name__
    return repr(dict(value)) if type(value).__name__ == 'mappingproxy' else repr(value)


def _defaults(fn) -> dict[str, object]:
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()}


def handwritten(page: str) -> str:
    """The hand-written part of the page's text ``page``: from the ``HANDWRITTEN`` heading to the end ('' if none)."""
    at = page.find(f'\n{HANDWRITTEN}\n')
    return '' if at < 0 else page[at + 1:]


def render() -> str:
    """The page's text: the tables rendered from the docstrings, then the page's hand-written part."""
    parts = ['# Constructor reference', '',
             'Generated from the docstrings by `python tools/reference_docs.py` (all but the last section, '
             f'"{HANDWRITTEN[3:]}", written by hand); `CPVT`, `PyramidCPVT`, `TwinsSVT` and `PVTv2` '
             "take their own trunk arguments (`TwinsSVT` also `PyramidCPVT`'s, the pyramids `Pyramid`'s) and every "
             'shared one. A named variant '
             '(`create_model(name, **overrides)`, '
             "a config's `arch=dict(base=name, ...)`) is a set of these arguments:", '',
             '| name | class | settings |', '|---|---|---|']
    parts += [f'| `{name}` | `{spec.cls.__name__}` | {", ".join(f"`{k}={v}`" for k, v in spec.settings.items())} |'
              for name, spec in sorted(MODEL_SPECS.items())]
    for cls in (PyramidCPVT, TwinsSVT, PVTv2, CPVT):
        parts += ['', f'## `{cls.__name__}`: the trunk', '', _table(documented_arguments(cls.__init__.__doc__),
                                                                    _defaults(cls.__init__))]
    parts += ['', '## Every pyramid\'s (`Pyramid`)', '', _table(documented_arguments(Pyramid.__init__.__doc__),
                                                                _defaults(Pyramid.__init__))]
    parts += ['', '## Shared arguments (`CPVTBase`)', '',
              _table(documented_arguments(CPVTBase.__init__.__doc__), _defaults(CPVTBase.__init__)), '']
    tail = handwritten(PAGE.read_text()) if PAGE.is_file() else ''
    return '\n'.join(parts) + (f'\n{tail}' if tail else '')


if __name__ == '__main__':
    atomic_write(PAGE, render().encode())
