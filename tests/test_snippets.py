"""Every Python snippet in README.md and docs/*.md runs as written, in order within its page (one namespace per
page, in a scratch folder), on the stack the page is for (the suite runs this on every stack): a page whose
packages are missing is skipped by name.
Lines that need the network end with the marker ``[network]``; they are skipped, each by its text, and nothing
else is."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NETWORK = '[network]'
# page -> the packages its snippets import (the default stack has README's; docs/ecosystems.md is for the
# ecosystems stack)
PAGES = {
    'README.md': ('timm', 'openvino', 'onnxruntime', 'onnxscript'),
    'docs/openmmlab.md': (),
    'docs/reliability.md': (),
    'docs/ecosystems.md': ('transformers', 'segmentation_models_pytorch', 'timm', 'torchvision'),
}
SNIPPET = re.compile(r'^```python\n(.*?)^```', re.S | re.M)


def snippets(page: str) -> list[str]:
    return SNIPPET.findall((ROOT / page).read_text())


def runnable(code: str) -> tuple[str, list[str]]:
    """``code`` with every ``[network]`` line replaced by ``pass`` (same indentation), and those lines."""
    kept, skipped = [], []
    for line in code.splitlines():
        if NETWORK in line:
            skipped.append(line.strip())
            line = line[:len(line) - len(line.lstrip())] + 'pass'
        kept.append(line)
    return '\n'.join(kept) + '\n', skipped


def test_every_page_with_python_snippets_is_covered():
    pages = {str(p.relative_to(ROOT)) for p in [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
             if snippets(str(p.relative_to(ROOT)))}
    assert pages == set(PAGES)


def test_network_lines_are_only_those_that_fetch():
    for page in PAGES:
        for code in snippets(page):
            for line in runnable(code)[1]:
                assert 'pretrained=True' in line or 'from_pretrained' in line, (page, line)


@pytest.mark.parametrize('page', sorted(PAGES))
def test_snippets_run_as_written(page, tmp_path, monkeypatch):
    missing = [m for m in PAGES[page] if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f'{page} is for a stack with {", ".join(missing)}')
    monkeypatch.chdir(tmp_path)
    namespace: dict = {'__name__': f'snippets of {page}'}
    for i, code in enumerate(snippets(page)):
        text, _ = runnable(code)
        exec(compile(text, f'{page} (python snippet {i + 1})', 'exec'), namespace)
