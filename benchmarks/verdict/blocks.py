"""The tables declared (``BLOCKS``: each a ``Block``, its comparison and the inputs it reads), the one renderer
(``render``) and the figures drawn beside them."""
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.confirm_detail.spec import Confirm
from benchmarks.study import report
from benchmarks.study.config import VARIANTS, StudyConfig
from benchmarks.study.summary import (
    DEVICES,
    EACH,
    RESULTS,
    SEEDS,
    Dense,
    Recipe,
    Record,
    Study,
    load_input,
    load_study,
)
from benchmarks.verdict.classification import (
    CENTRAL,
    CENTRAL_SEEDS,
    HEADLINE,
    RECIPES,
    TF32_STUDIES,
    at_training_size,
    central,
    changes,
    device,
    head,
    paper_pairs,
    probe,
    recipe_cells,
    recipes,
    tf32,
)
from benchmarks.verdict.dense_demo import DEMO, DEMO_ENGINES, batch_company, confirm, demo, demo_engines, dense
from cpvt_backbones.utils import pyplot

HEADLINE_STUDY = Study(HEADLINE, 'cpu', complete=('*',))
RECIPE_STUDIES = {recipe: Study(names, EACH) for recipe, names in RECIPES.items()}
ARM_NOTE = ('Top-1 (%) on {test_images} test images, mean ± std over seeds {seeds}, trained on the {device_name}; the '
            'change from {base} px as mean [95% interval], bold where the interval excludes zero. {files}.')


@dataclass(frozen=True)
class Block:
    """One table of the documents (``<!-- verdict:NAME -->``): the ``comparison`` called on its ``inputs`` (keyword
    -> ``Study``, ``Record`` or a mapping of them, loaded by ``load_input``) and ``options``."""
    name: str
    comparison: Callable[..., str]
    inputs: Mapping[str, object]
    options: Mapping[str, object] = field(default_factory=dict)


BLOCKS = (
    Block('headline', changes, dict(s=HEADLINE_STUDY), dict(paper=True, leaders=True, note=(
        'Top-1 (%) on {test_images} Fashion-MNIST test images, mean ± std over seeds {seeds}, every run trained on the '
        "CPU (one thread; the same studies' GPU runs are left out); the change from {base} px as mean [95% interval] "
        'over the seeds, bold where the interval excludes zero. From {files} (benchmarks/results/).'))),
    Block('headline-probe', probe, dict(s=HEADLINE_STUDY), dict(note=(
        'R² of a ridge regression from the final patch tokens to their relative position, fitted at {base} px and '
        'scored on other images at every size; mean ± std over seeds {seeds}, runs trained on the CPU.'))),
    Block('training-size', at_training_size,
          dict(columns={'ours': Study(HEADLINE, 'cpu'),
                        'aliased crops': Study(('resolution_crop_cls_aliased',), 'cpu')}),
          dict(note=f'Top-1 (%) at the training size, mean ± std over seeds {", ".join(map(str, SEEDS))}, every run '
                    'trained on the CPU; the paper: DeiT-tiny on ImageNet. Aliased crops: '
                    '`resolution_crop_cls_aliased.json` (its runs predate the device record; its command names no '
                    '--device, so they trained on the CPU).')),
    Block('paper-pairs', paper_pairs, dict(s=Study(HEADLINE, 'cpu')), dict(gap=0.5)),
    Block('recipes', recipes, dict(recipes=RECIPE_STUDIES), dict(a='peg_0-5', b='learned')),
    Block('control', changes, dict(s=Study(('control_cnn_cpu',), 'cpu', seeds=None)), dict(
        first='model', labels={'cnn': 'CNN, no position encoding (GAP)'}, losing=True, note=(
            'Seeds {seed_list}, trained on the CPU under the default recipe (random resized crops of the 28 px '
            'originals to {base} px, {epochs} epochs); {files}.'))),
    Block('head', head, dict(gap=RECIPE_STUDIES['default (GAP)'], cls=RECIPE_STUDIES['class token'])),
    Block('device', device, dict(recipes={r: RECIPE_STUDIES[r] for r in ('default (GAP)', 'class token')},
                                 tf32_off=Study((TF32_STUDIES['off'],), 'cuda'))),
    Block('tf32', tf32, dict(gpu={m: Study((n,), 'cuda') for m, n in TF32_STUDIES.items()},
                             cpu=Study(RECIPES['default (GAP)'], 'cpu'),
                             recipe=Recipe(RECIPES['default (GAP)'] + tuple(TF32_STUDIES.values())))),
    Block('central', central, dict(s=Study((CENTRAL,), seeds=CENTRAL_SEEDS, complete=('peg_0-5', 'learned'))), dict(
        a='peg_0-5', b='learned', note=(
            'The default recipe (global average pooling), seeds {seeds} fixed before they ran, {test_images} test '
            'images, every run on one GPU with TF32 off; mean ± std, and changes and differences paired by seed as '
            'mean [95% interval], bold where the interval excludes zero. {files}.'))),
    Block('confirm', confirm, dict(s=Confirm('confirm_detail', 'benchmarks/protocols/confirm_detail.json'))),
    Block('resize-protocol', changes, dict(s=Study(('resolution_resize_cls',))), dict(note=ARM_NOTE)),
    Block('grid14', changes, dict(s=Study(('resolution_crop_grid14_cls',))), dict(probe=True, note=ARM_NOTE)),
    Block('dense', dense, dict(s=Dense('dense_study'))),
    Block('demo', demo, dict(run=Record(DEMO))),
    Block('demo-engines', demo_engines, dict(engines=Record(DEMO_ENGINES), trained=Record(DEMO))),
    Block('batch-company', batch_company, dict(run=Record('batch_company_avx2'))),
)


BLOCK = {block.name: block for block in BLOCKS}


def render(block: Block | str, results: Path = RESULTS) -> str:
    """The one renderer: a block (or its name) from the result files under ``results``."""
    block = BLOCK[block] if isinstance(block, str) else block
    return block.comparison(**{k: load_input(v, results) for k, v in block.inputs.items()}, **block.options)


def headline_figures(results: Path = RESULTS, out: Path = RESULTS) -> list[Path]:
    """The headline's runs trained on the CPU (seeds 0-2) drawn as a study draws its own: top-1 and the change
    per test grid (``verdict_headline.png``), and the position probe (``verdict_headline_probe.png``)."""
    s = load_study(Study(HEADLINE, 'cpu'), results)   # refuses a (variant, seed) trained twice with other results
    meta = s.meta
    cpu = list({(r['variant'], r['seed']): r for r in s.runs if r['device'] == 'cpu' and r['seed'] in SEEDS}.values())
    config = StudyConfig(variants=tuple(v for v in VARIANTS if any(r['variant'] == v for r in cpu)), seeds=SEEDS,
                         image_size=meta['image_size'], test_sizes=tuple(meta['test_sizes']),
                         patch=meta['model']['patch'], head=meta['model']['head'],
                         test_resample=meta['test_resample'])
    paths = [out / 'verdict_headline.png', out / 'verdict_headline_probe.png']
    report.plot(report.summarise(cpu, config), config, paths[0])
    report.plot_probe(report.summarise_probe(cpu, config), config, paths[1])
    return paths


def recipes_figure(results: Path = RESULTS, out: Path = RESULTS, a: str = 'peg_0-5', b: str = 'learned') -> Path:
    """The recipes table drawn (``verdict_recipes.png``): per recipe and training device, ``a`` minus ``b`` at
    the training size and in the change to every larger size, with 95% intervals."""
    cells = list(recipe_cells(load_input(RECIPE_STUDIES, results), a, b))
    plt = pyplot()
    whats = list(cells[0][3])
    fig, axes = plt.subplots(1, len(whats), figsize=(4.2 * len(whats), 4.8), squeeze=False, sharey=False)
    for ax, what in zip(axes[0], whats, strict=True):
        for i, (_, trained_on, _, diffs) in enumerate(cells):
            d = diffs[what]
            low, high = (d['mean'] - d['lo'], d['hi'] - d['mean']) if d['lo'] is not None else (0, 0)
            ax.errorbar(d['mean'], i, xerr=[[low], [high]], fmt='o' if trained_on == 'cpu' else 's', capsize=3,
                        color='black' if d['sign'] != '=' else 'grey')
        ax.axvline(0, color='black', lw=0.8)
        ax.set_yticks(range(len(cells)), [f'{r} ({DEVICES[d]}, seeds {",".join(map(str, s))})'
                                          for r, d, s, _ in cells], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[0][1:]:
        ax.set_yticklabels([])
    fig.suptitle(f'{VARIANTS[a].label} minus {VARIANTS[b].label}, paired by seed (points, 95% interval; black: '
                 'the interval excludes zero; circles CPU, squares GPU)', fontsize=9)
    fig.tight_layout()
    path = out / 'verdict_recipes.png'
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)
    return path
