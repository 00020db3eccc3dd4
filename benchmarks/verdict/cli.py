"""``python -m benchmarks.verdict``: every table printed, and with ``--write`` rewritten where the documents hold
it (between ``<!-- verdict:NAME -->`` and ``<!-- /verdict:NAME -->``), the figures drawn."""
import argparse
import re
from collections.abc import Sequence
from pathlib import Path

from benchmarks import verdict
from benchmarks.study.summary import RESULTS
from benchmarks.verdict.blocks import BLOCKS, headline_figures, recipes_figure, render

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / 'README.md', ROOT / 'docs/resolution_study.md', ROOT / 'docs/performance.md',
             ROOT / 'docs/reliability.md')
MARKER = re.compile(r'<!-- verdict:(?P<name>[\w-]+) -->\n(?:(?P<body>.*?)\n)?<!-- /verdict:(?P=name) -->', re.S)


def blocks_in(text: str) -> dict[str, str]:
    """The verdict blocks a document holds: name -> body."""
    return {m['name']: m['body'] or '' for m in MARKER.finditer(text)}


def rewrite(text: str, rendered: dict[str, str]) -> str:
    """``text`` with every verdict block's body replaced by its rendering (an unknown name is an error)."""
    unknown = set(blocks_in(text)) - set(rendered)
    if unknown:
        raise ValueError(f'unknown verdict block(s) {sorted(unknown)}; the blocks are {sorted(rendered)}')
    return MARKER.sub(lambda m: f'<!-- verdict:{m["name"]} -->\n{rendered[m["name"]]}\n<!-- /verdict:{m["name"]} -->',
                      text)


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    p = argparse.ArgumentParser(prog='python -m benchmarks.verdict', description=verdict.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--results', type=Path, default=RESULTS)
    p.add_argument('--write', action='store_true',
                   help='rewrite the blocks in README.md and docs/, and draw the figures (verdict_*.png in --results)')
    args = p.parse_args(argv)
    rendered = {block.name: render(block, args.results) for block in BLOCKS}
    for name, text in rendered.items():
        print(f'<!-- verdict:{name} -->\n{text}\n')
    if args.write:
        for path in DOCUMENTS:
            text = path.read_text()
            if blocks_in(text):
                path.write_text(rewrite(text, rendered))
        headline_figures(args.results, args.results)
        recipes_figure(args.results, args.results)
    return rendered
