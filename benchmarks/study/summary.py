"""A study's results as typed summaries, for the tables that compare them (``benchmarks.verdict``): what a table
reads (a ``Study``'s runs pooled from result files, on one device; a ``Recipe``; a ``Record`` as written) and
what it gets (a ``Summary``: {variant: {seed: top-1 per test key}} with the recipe, the training size and the
test sizes). Pooling refuses studies of other recipes and a run with two results; a summary holds one device.
"""
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.study.config import VARIANTS

RESULTS = Path(__file__).resolve().parents[1] / 'results'

# What must agree between studies whose runs one table pools (everything that decides a run and its test).
RECIPE_FIELDS = ('dataset', 'train_images', 'test_images', 'image_size', 'test_sizes', 'epochs', 'batch_size', 'lr',
                 'weight_decay', 'drop_path', 'crop_scale', 'crop_resample', 'test_resample', 'decay_position',
                 'model')


DEVICES = {'cpu': 'CPU', 'cuda': 'GPU'}


# The seeds every study fixed before it ran. Some cells added seeds 3-5 later, by a rule that looked at test
# accuracy (until the leader at 2x was consistent): the tables leave those runs out.
SEEDS = (0, 1, 2)


def load(name: str, results: Path = RESULTS) -> dict:
    return json.loads((results / f'{name}.json').read_text())


def pooled_runs(names: Sequence[str], results: Path = RESULTS) -> tuple[dict, list[dict]]:
    """The runs of the studies ``names`` (one run once: studies that share run directories list it twice), with
    the recipe they share; a ValueError where the studies' recipes differ or one run has two results."""
    names = tuple(dict.fromkeys(names))
    metas, runs = {}, {}
    for name in names:
        data = load(name, results)
        metas[name] = {k: data['meta'].get(k) for k in RECIPE_FIELDS}
        for run in data['runs']:
            if 'device' not in run:   # written before runs recorded their device: by a command without --device
                if '--device' in data['meta']['command']:
                    raise ValueError(f'{name}: a run without its device, under a command that names one')
                run = dict(run, device='cpu')
            key = (data['meta'].get('runs', name), run['variant'], run['seed'])
            if key in runs and runs[key]['top1'] != {k: v for k, v in run['top1'].items() if k in runs[key]['top1']}:
                raise ValueError(f'{name}: run {key} has other results than in another study')
            runs.setdefault(key, run)
    first, *others = metas.values()
    for name, meta in zip(names[1:], others, strict=True):
        if meta != first:
            raise ValueError(f'{names[0]} and {name} differ in their recipe: '
                             f'{ {k: (first[k], meta[k]) for k in first if first[k] != meta[k]} }')
    return first, list(runs.values())


def by_device(runs: list[dict], device: str, seeds: Sequence[int] | None = SEEDS) -> dict[str, dict[int, dict]]:
    """{variant: {seed: top-1 per test key}} of the runs of ``seeds`` (None: all) trained on ``device``; a
    ValueError if one (variant, seed) trained twice there under different results."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for run in runs:
        if run['device'] == device and (seeds is None or run['seed'] in seeds):
            of_variant = out.setdefault(run['variant'], {})
            if run['seed'] in of_variant and of_variant[run['seed']] != run['top1']:
                raise ValueError(f'{run["variant"]} seed {run["seed"]} on {device}: two runs with other results')
            of_variant[run['seed']] = run['top1']
    return out


EACH = 'each'   # a Study's device: one Summary per device its runs trained on


@dataclass(frozen=True)
class Study:
    """What a comparison reads: the runs of the studies ``names`` (result files under the results folder, pooled:
    one recipe), on ``device`` (None: the one device they trained on, an error where several; ``EACH``: a
    ``Summary`` per device), at ``seeds`` (None: every seed); ``complete``: variants that must have every one
    of ``seeds`` ('*': all)."""
    names: tuple[str, ...]
    device: str | None = None
    seeds: tuple[int, ...] | None = SEEDS
    complete: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """What a comparison reads: the recipe the studies ``names`` share (``pooled_runs``, which refuses studies of
    other recipes), without their runs."""
    names: tuple[str, ...]


@dataclass(frozen=True)
class Record:
    """What a comparison reads: one result file as it was written (a study's own report, the demo's summary)."""
    name: str


@dataclass(frozen=True)
class Summary:
    """The typed summary of a ``Study`` on one device: ``top1`` {variant: {seed: top-1 per test key}} (variants in
    the order the runs list them), the recipe the studies share (``meta``), each study's own meta (``metas``),
    every pooled run (``runs``, all devices) and the run folders the studies keep (``folders``)."""
    names: tuple[str, ...]
    device: str
    meta: dict
    metas: dict[str, dict]
    runs: list[dict]
    folders: tuple[Path, ...]
    top1: dict[str, dict[int, dict[str, float]]]

    @property
    def base(self) -> int:
        """The training size (px)."""
        return self.meta['image_size']

    @property
    def sizes(self) -> list[int]:
        """The test sizes other than the training size."""
        return [s for s in self.meta['test_sizes'] if s != self.base]

    def variants(self) -> list[str]:
        """Its variants in ``VARIANTS`` order."""
        return [v for v in VARIANTS if v in self.top1]

    def seeds(self, variant: str) -> dict[int, dict[str, float]]:
        """{seed: top-1 per test key} of ``variant``, by seed."""
        return dict(sorted(self.top1[variant].items()))

    def at_base(self, variant: str) -> list[float]:
        return [t[str(self.base)] for t in self.seeds(variant).values()]

    def fields(self) -> dict[str, object]:
        """What a block's note may name: test_images, epochs, base, seeds ('0, 1, 2'), seed_list ('[0, 1, 2]'),
        files ('`a.json`, `b.json`'), device_name ('CPU')."""
        seeds = sorted({s for by_seed in self.top1.values() for s in by_seed})
        return dict(test_images=self.meta['test_images'], epochs=self.meta['epochs'], base=self.base,
                    seeds=', '.join(map(str, seeds)), seed_list=seeds, device_name=DEVICES[self.device],
                    files=', '.join(f'`{n}.json`' for n in self.names))


@dataclass(frozen=True)
class RecordData:
    name: str
    data: dict


@dataclass(frozen=True)
class DenseSummary:
    """The typed summary of a dense study: ``scores`` {task: {variant: {seed: score per test factor}}} (seeds in
    order) and the seeds its invocation fixed."""
    name: str
    seeds: list[int]
    scores: dict[str, dict[str, dict[int, dict[str, float]]]]


@dataclass(frozen=True)
class Dense:
    """What a comparison reads: a dense study (``benchmarks.dense_study``) by its result file's name."""
    name: str

    def load(self, results: Path = RESULTS) -> DenseSummary:
        """Its ``DenseSummary``: every run's scores by task, variant and seed."""
        data = load(self.name, results)
        scores: dict = {}
        for run in sorted(data['runs'], key=lambda r: r['seed']):
            scores.setdefault(run['task'], {}).setdefault(run['variant'], {})[run['seed']] = run['scores']
        return DenseSummary(self.name, list(data['meta']['seeds']), scores)


def load_study(study: Study, results: Path = RESULTS) -> Summary | dict[str, Summary]:
    """The ``Summary`` (or, for ``EACH``, {device: ``Summary``}) of ``study``'s runs."""
    meta, runs = pooled_runs(study.names, results)
    metas = {name: load(name, results)['meta'] for name in dict.fromkeys(study.names)}
    folders = tuple(results / 'recipe_runs' / m['runs'] for m in metas.values() if 'runs' in m)
    devices = sorted({r['device'] for r in runs})

    def summary(device: str) -> Summary:
        top1 = by_device(runs, device, study.seeds)
        need = list(top1) if study.complete == ('*',) else study.complete
        if study.seeds is not None and any(sorted(top1.get(v, {})) != list(study.seeds) for v in need):
            raise ValueError(f'{", ".join(study.names)}: needs seeds {study.seeds} of '
                             f'{"every variant" if study.complete == ("*",) else ", ".join(need)} on {device}')
        return Summary(study.names, device, meta, metas, runs, folders, top1)
    if study.device == EACH:
        return {d: summary(d) for d in devices}
    if study.device is None and len(devices) != 1:
        raise ValueError(f'{", ".join(study.names)}: runs trained on {devices}; a table compares runs of one device')
    return summary(study.device or devices[0])


def load_input(spec, results: Path = RESULTS):
    """A block's input loaded: a ``Study`` as its summary, a ``Dense`` study as its typed summary, a ``Record`` as
    its file, a ``Recipe`` as the recipe (dict), a spec with its own ``load(results)`` (a study's, such as
    ``benchmarks.confirm_detail.spec.Confirm``) as what that returns, a mapping entry by entry."""
    if isinstance(spec, Study):
        return load_study(spec, results)
    if isinstance(spec, Record):
        return RecordData(spec.name, load(spec.name, results))
    if isinstance(spec, Recipe):
        return pooled_runs(spec.names, results)[0]
    if hasattr(spec, 'load'):
        return spec.load(results)
    return {key: load_input(value, results) for key, value in spec.items()}


__all__ = ['DEVICES', 'EACH', 'RECIPE_FIELDS', 'RESULTS', 'SEEDS', 'Dense', 'DenseSummary', 'Recipe', 'Record',
           'RecordData', 'Study', 'Summary', 'by_device', 'load', 'load_input', 'load_study', 'pooled_runs']
