"""The constructors' arguments are documented once, in their docstrings, and docs/reference.md renders them."""
import importlib.util
from pathlib import Path

import pytest

from cpvt_backbones.models import CPVT, PVTv2, PyramidCPVT, TwinsSVT
from cpvt_backbones.models.base import CPVTBase

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location('reference_docs', ROOT / 'tools' / 'reference_docs.py')
reference_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference_docs)


@pytest.mark.parametrize('cls', [PyramidCPVT, TwinsSVT, PVTv2, CPVT])
def test_every_constructor_argument_is_documented(cls):
    own = reference_docs.documented_arguments(cls.__init__.__doc__)
    documented = reference_docs.documented(cls)
    assert set(cls.argument_names()) == set(documented) - {'**kwargs'}
    assert set(reference_docs.documented_arguments(CPVTBase.__init__.__doc__)) <= set(documented)
    assert '**kwargs' in own and all(text.strip() for text in documented.values())


def test_documented_arguments_reads_continuation_lines_and_stops_at_the_section_end():
    doc = '''Summary.

    Args:
        a: first line
            second line.
        b: one line.

    Returns: nothing.
    '''
    assert reference_docs.documented_arguments(doc) == {'a': 'first line second line.', 'b': 'one line.'}


def test_reference_page_matches_the_docstrings():
    assert (ROOT / 'docs' / 'reference.md').read_text() == reference_docs.render(), \
        'docs/reference.md is out of date: run python tools/reference_docs.py'
