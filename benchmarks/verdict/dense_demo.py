"""The other tables: the preregistered native-detail study's own report, the dense study, the demo and its engines,
and the batch-company record."""
import itertools
import shlex

from benchmarks.confirm_detail.spec import ConfirmReport
from benchmarks.study.common import mean_std, paired
from benchmarks.study.summary import DenseSummary, RecordData
from benchmarks.verdict.tables import cell, change, common, loss, table


def confirm(s: ConfirmReport) -> str:
    """The task whose larger test sizes carry real detail by construction, under its preregistered protocol
    (``benchmarks.confirm_detail``): its own report, analysed again from its runs."""
    return s.markdown()


DENSE_BACKBONES = {'peg': 'pcpvt_tiny (PEG)', 'pvt': 'mmdet PVT v1 (learned, resized)',
                   'none': 'pcpvt_tiny without PEG', 'learned': 'pcpvt_tiny, learned table (resized)',
                   'rope_mixed': 'pcpvt_tiny, RoPE-Mixed'}   # benchmarks/dense_study's backbones


def dense(s: DenseSummary) -> str:
    """The dense study (one device, the CPU): per task and backbone the score at 1x, the change at 2x and 3x, and
    what drawing the scenes at 2x adds over resizing them, paired by seed; then how many pairs of backbones differ
    in their change, with the interval excluding zero."""
    out = []
    for task, metric in (('detection', 'bbox mAP'), ('segmentation', 'mIoU (%)')):
        scores = {v: s.scores[task].get(v, {}) for v in DENSE_BACKBONES}
        rows = []
        for variant, label in DENSE_BACKBONES.items():
            seeds = scores[variant]
            m, sd = mean_std([t['1'] for t in seeds.values()], 1)
            cells = [loss(seeds, k, '1') for k in ('2', '3')]
            cells.append(paired([t['drawn2'] for t in seeds.values()], [t['2'] for t in seeds.values()]))
            rows.append([label, f'{m:.1f} ± {sd:.1f}'] + list(map(cell, cells)))
        separated = {}
        for key in ('1', '2', '3'):
            count = 0
            for a, b in itertools.combinations(DENSE_BACKBONES, 2):
                x, y = common(scores[a], scores[b])
                d = (paired([t['1'] for t in x.values()], [t['1'] for t in y.values()]) if key == '1' else
                     paired(change(x, key, '1'), change(y, key, '1')))
                count += d['sign'] != '='
            separated[key] = count
        count = len(DENSE_BACKBONES) * (len(DENSE_BACKBONES) - 1) // 2
        out += table([f'{task}: backbone', f'{metric} at 1x', 'change at 2x', 'change at 3x',
                      'drawn minus resized at 2x'], rows)
        out += ['', f'Pairs of {task} backbones whose difference has an interval excluding zero: '
                f'{separated["1"]} of {count} at 1x, {separated["2"]} in the change to 2x, '
                f'{separated["3"]} in the change to 3x.', '']
    return '\n'.join(out[:-1]) + (
        f'\n\nMean ± std and paired differences over seeds {s.seeds} (mean [95% interval], bold '
        f'where the interval excludes zero); every run on the CPU. `{s.name}.json`.')


DEMO = 'demo_run_avx2'   # `make demo` from nothing: tools/demo.py's summary.json with its machine and command
DEMO_ENGINES = 'demo_avx2'   # the same trainings evaluated again on other engines and precisions
DEMO_REFERENCE = 'torch fp32'
DEMO_TOLERANCE = 0.005   # how far an engine and precision may move the demo's metrics


def _out_dir(data: dict) -> str:
    args = shlex.split(data['command'])
    return args[args.index('--out') + 1] if '--out' in args else 'work_dirs/demo'


def demo(run: RecordData) -> str:
    """The demo's detectors and segmentors at every test size, as `make demo` ran them (its engine and precision,
    at each evaluation batch size it ran), from a run that trained everything, with its wall time."""
    name, data = run.name, run.data
    untrained = {'pretraining', *data['task_seconds']} - set(data['trained'])
    if untrained:
        raise ValueError(f'{name}.json does not time the demo from nothing (reused: {sorted(untrained)})')
    tasks = list(data['results'])
    columns = list(next(iter(data['results'][tasks[0]].values())))
    engines = {c.split(' batch ')[0] for c in columns}
    if len(engines) != 1:
        raise ValueError(f'{name}.json holds {sorted(engines)}: the timed run evaluates one engine and precision')
    (engine,) = engines
    labels = data['labels']   # tools/demo.py: each column's model and metric
    heads = [(t, c) for t in tasks for c in columns]
    sizes = list(data['results'][tasks[0]])
    lines = ['| test resolution | ' + ' | '.join(labels[t] + (f' {c[len(engine) + 1:] or "batch 1"}'
                                                             if len(columns) > 1 else '') for t, c in heads) + ' |',
             '|---|' + '---|' * len(heads)]
    lines += [f'| {size} | ' + ' | '.join(f'{data["results"][t][size][c]:.3f}' for t, c in heads) + ' |'
              for size in sizes]
    if data.get('dirty'):
        raise ValueError(f'{name}.json was run on a tree with uncommitted changes at {data.get("commit")}: run the '
                         'demo on a clean clone')
    flags = '; ' + ', '.join(data['flags']) if data['flags'] else ''
    at = f' at commit {data["commit"][:7]}' if data.get('commit') else ''
    return '\n'.join(lines) + (
        f'\n\nEngine and precision: {engine}. Pretraining: top-1 {data["pretraining_top1"]:.1f}% on the 400 '
        f'held-out crops. '
        f'`{data["command"]}` (`make demo`, into another folder){at} trained, evaluated and drew everything in '
        f'{data["minutes"]:.1f} min on {data["cpu"]} ({data["isa"]}{flags}), torch {data["torch"]}, '
        f'{data["jobs"]} tasks at a time after the pretraining (`benchmarks/results/{name}.json`).')


def demo_engines(engines: RecordData, trained: RecordData) -> str:
    """Every engine and precision the summary ``engines`` holds against torch float32 on the checkpoints of the run
    ``trained`` (``engines`` reused them all): the largest absolute difference in bbox mAP and mIoU over the test
    sizes, and where."""
    name, data, source = engines.name, engines.data, _out_dir(trained.data)
    if data['trained'] or _out_dir(data) != source:
        raise ValueError(f'{name}.json is not an evaluation of the trainings of {trained.name}.json '
                         f'(trained now: {data["trained"]}; {_out_dir(data)} against {source})')
    tasks = list(data['results'])
    columns = [c for c in next(iter(data['results'][tasks[0]].values())) if c != DEMO_REFERENCE]
    lines = ['| engine, precision | ' + ' | '.join(f'{data["labels"][t]}: largest change from {DEMO_REFERENCE}'
                                                  for t in tasks) + ' |',
             '|---|' + '---|' * len(tasks)]
    beyond = []
    for column in columns:
        cells = []
        for task in tasks:
            by_size = data['results'][task]
            size = max(by_size, key=lambda k: abs(by_size[k][column] - by_size[k][DEMO_REFERENCE]))
            delta = by_size[size][column] - by_size[size][DEMO_REFERENCE]
            cells.append(f'{delta:+.3f} ({size})')
            if round(abs(delta), 3) > DEMO_TOLERANCE:
                beyond.append(f'{column} ({task})')
        lines.append(f'| {column} | ' + ' | '.join(cells) + ' |')
    verdict = (f'beyond {DEMO_TOLERANCE} of {DEMO_REFERENCE}: {", ".join(beyond)}' if beyond else
               f'every engine and precision within {DEMO_TOLERANCE} of {DEMO_REFERENCE} at every test size')
    return '\n'.join(lines) + f'\n\nFrom `benchmarks/results/{name}.json` (`{data["command"]}`): {verdict}.'


def batch_company(run: RecordData) -> str:
    """The demo's trained models at batch 1 and in padded batches (``benchmarks.batch_company``), each way's
    largest change from batch 1."""
    from benchmarks.batch_company import table as company_table
    name, data = run.name, run.data
    largest = {way: max(abs(r['value'] - base['value']) for r in data['rows'] if r['way'] == way
                        for base in data['rows'] if base['way'] == data['ways'][0] and
                        (base['score'], base['size']) == (r['score'], r['size']))
               for way in data['ways'][1:]}
    return company_table(data) + ' Largest change from batch 1: ' + ', '.join(
        f'{way} {value:.3f}' for way, value in largest.items()) + f' (`benchmarks/results/{name}.json`).'
