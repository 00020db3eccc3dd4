"""What a comparison (``benchmarks.verdict``) reads of a native-detail study: its result file's name (``Native``),
loaded as the study's summary rendered again from its runs (``NativeSummary``)."""
from dataclasses import dataclass
from pathlib import Path

from benchmarks.native_detail.design import recorded_config
from benchmarks.native_detail.selection import summarise
from benchmarks.study.config import StudyConfig
from benchmarks.study.summary import RESULTS, load


@dataclass(frozen=True)
class NativeSummary:
    """The typed summary of a native-detail study, on one accelerator: its ``StudyConfig`` as recorded, its meta
    and ``selection.summarise``'s analyses (checks selected, levels, changes, leaders)."""
    name: str
    config: StudyConfig
    meta: dict
    summary: dict


@dataclass(frozen=True)
class Native:
    """What a comparison reads: a native-detail study by its result file's name."""
    name: str

    def load(self, results: Path = RESULTS) -> NativeSummary:
        """The study summarised again from its runs under ``results``; a ValueError where they trained on more
        than one accelerator."""
        data = load(self.name, results)
        meta, runs = data['meta'], data['runs']
        devices = {r['accelerator'] for r in runs}
        if len(devices) != 1:
            raise ValueError(f'{self.name}: runs trained on {sorted(devices)}; a table compares one device')
        config = recorded_config(meta, list(dict.fromkeys(r['variant'] for r in runs)))
        # the per-epoch form (native_matched) predates these two settings: one check an epoch, no smoothing
        meta = dict(meta, checks_per_epoch=meta.get('checks_per_epoch', 1))
        return NativeSummary(self.name, config, meta, summarise(runs, config, meta.get('smooth', 1), meta.get('level'),
                                                                meta.get('window', 1), meta.get('match', 'first')))
