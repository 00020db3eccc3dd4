"""What a comparison (``benchmarks.verdict``) reads of a confirm_detail study: its report's name and the protocol
file its runs ran under (``Confirm``), loaded as the report analysed again from its runs (``ConfirmReport``)."""
from dataclasses import dataclass
from pathlib import Path

from benchmarks.confirm_detail.protocol import ROOT, Protocol
from benchmarks.confirm_detail.render import analyse, render_markdown
from benchmarks.study.summary import RESULTS, load


@dataclass(frozen=True)
class ConfirmReport:
    """A confirm_detail report (``document``, as the study writes it) with its analyses computed again from its
    runs, and the protocol they ran under."""
    name: str
    protocol: Protocol
    document: dict

    def markdown(self) -> str:
        """The report's Markdown, as the study renders it."""
        return render_markdown(self.document, self.protocol).rstrip('\n')


@dataclass(frozen=True)
class Confirm:
    """What a comparison reads: a confirm_detail report by its result file's name, and its protocol file (relative
    to the repository)."""
    name: str
    protocol: str

    def load(self, results: Path = RESULTS) -> ConfirmReport:
        """The report under ``results`` analysed again from its runs under the protocol file; a ValueError where
        the report or a run records another protocol than the file, or the runs trained on more than one
        accelerator."""
        data = load(self.name, results)
        protocol = Protocol.load(ROOT / self.protocol)
        meta, runs = data['meta'], data['runs']
        recorded = {meta['protocol_sha256'], *(r['protocol_sha256'] for r in runs)}
        if recorded != {protocol.sha256} or data['protocol'] != protocol.data:
            raise ValueError(f'{self.name}: its runs record protocol sha256 {sorted(h[:12] for h in recorded)}, '
                             f'not {self.protocol}\'s ({protocol.sha256[:12]})')
        devices = sorted({r['accelerator'] for r in runs})
        if len(devices) != 1:
            raise ValueError(f'{self.name}: runs trained on {devices}; a table compares one device')
        results_by: dict[str, list[dict]] = {}
        for r in runs:
            results_by.setdefault(r['candidate'] or '', []).append(r)
        return ConfirmReport(self.name, protocol, dict(data, **analyse(results_by, protocol, meta['pilot'])))
