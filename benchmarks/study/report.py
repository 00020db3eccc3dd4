"""A study's report: its runs' results summarised (per variant and test: top-1 over seeds and the change from
the training size, paired by seed; accuracy by position; the position probe) and rendered as Markdown, CSV,
JSON and figures (``StudyReport``)."""
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmarks.study.common import mean_std
from benchmarks.study.config import VARIANTS, StudyConfig
from benchmarks.study.data import MEAN, STD, resize
from benchmarks.study.grid import write_report
from benchmarks.study.specs import OnCanvas, Resized, placements, size_tests
from benchmarks.study.trainer import build_model, peg_response
from cpvt_backbones.utils import pyplot


def summarise(results: list[dict], config: StudyConfig) -> list[dict]:
    """One row per (variant, test): per-seed top-1, mean, standard deviation, and the change from the
    training size (paired by seed)."""
    rows = []
    for variant in config.variants:
        runs = sorted((r for r in results if r['variant'] == variant), key=lambda r: r['seed'])
        base = Resized(config.image_size, config.test_resample).key
        for test in size_tests(config):
            size, key = test.size, test.key
            accs = [r['top1'][key] for r in runs]
            (m, s), (dm, ds) = mean_std(accs), mean_std([r['top1'][key] - r['top1'][base] for r in runs])
            rows.append(dict(variant=variant, test='canvas' if isinstance(test, OnCanvas) else 'resize', size=size,
                             factor=round(size / config.image_size, 2), grid=size // config.patch, top1_mean=m,
                             top1_std=s, change_mean=dm, change_std=ds, top1_per_seed=[round(a, 2) for a in accs],
                             seeds=[r['seed'] for r in runs]))
    return rows


def line_style(variant: str, plt) -> dict:
    """A colour of its own per encoding (up to 20), the line by family: PEGs solid, tables dashed, RoPE
    dash-dotted, the rest dotted."""
    family = ('-' if variant.startswith('peg') else '--' if variant.startswith(('learned', 'sincos')) else
              '-.' if variant.startswith('rope') else ':')
    return dict(color=plt.cm.tab20(list(VARIANTS).index(variant) % 20), ls=family, marker='o', ms=4)


def plot(rows: list[dict], config: StudyConfig, path: Path) -> None:
    plt = pyplot()
    train_grid = config.image_size // config.patch
    panels = [('resize', 'top1', 'top-1 (%)', 'images resized'),
              ('resize', 'change', f'change from {train_grid} x {train_grid} (points)', 'images resized')]
    if config.canvas_sizes:
        panels.append(('canvas', 'change', f'change from {train_grid} x {train_grid} (points)',
                       f'{config.image_size} px images centred on a blank canvas'))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (test, value, ylabel, title) in zip(axes[0], panels, strict=False):
        for variant in config.variants:
            r = [row for row in rows if row['variant'] == variant and (row['test'] == test or
                                                                       row['size'] == config.image_size)]
            ax.errorbar([row['grid'] for row in r], [row[f'{value}_mean'] for row in r],
                        yerr=[row[f'{value}_std'] for row in r], capsize=3, label=VARIANTS[variant].label,
                        **line_style(variant, plt))
        ax.axvline(train_grid, color='grey', ls=':', lw=1)
        if value == 'change':
            ax.axhline(0, color='black', lw=0.8)
        ax.set_xlabel('test token grid (side); training grid dotted')
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(sorted({row['grid'] for row in rows}))
        ax.grid(alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc='center left', bbox_to_anchor=(1, 0.5), fontsize=8)
    fig.suptitle(f'Fashion-MNIST, trained at {config.image_size} px ({train_grid} x {train_grid} tokens), tested '
                 f'without fine-tuning; mean +- std over {len(rows[0]["seeds"])} seeds', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def summarise_placements(results: list[dict], config: StudyConfig) -> list[dict]:
    rows = []
    for variant in config.variants:
        runs = sorted((r for r in results if r['variant'] == variant), key=lambda r: r['seed'])
        for spot in placements(config):
            top, left, accs = spot.top, spot.left, [r['top1'][spot.key] for r in runs]
            m, sd = mean_std(accs)
            rows.append(dict(variant=variant, canvas=config.placement_canvas, top=top, left=left, top1_mean=m,
                             top1_std=sd, top1_per_seed=[round(a, 2) for a in accs]))
    return rows


def plot_placements(rows: list[dict], config: StudyConfig, path: Path) -> None:
    plt = pyplot()
    offsets = sorted({row['top'] for row in rows})
    fig, axes = plt.subplots(1, len(config.variants), figsize=(3.3 * len(config.variants) + 1, 3.6), squeeze=False)
    for ax, variant in zip(axes[0], config.variants, strict=False):
        cells = {(row['top'], row['left']): row for row in rows if row['variant'] == variant}
        grid = np.array([[cells[(r, c)]['top1_mean'] for c in offsets] for r in offsets])
        image = ax.imshow(grid, vmin=0, vmax=100, cmap='viridis')
        for i, r in enumerate(offsets):
            for j, c in enumerate(offsets):
                ax.text(j, i, f'{cells[(r, c)]["top1_mean"]:.0f}\n±{cells[(r, c)]["top1_std"]:.0f}', ha='center',
                        va='center', fontsize=8, color='white' if grid[i, j] < 60 else 'black')
        ax.set_xticks(range(len(offsets)), [f'x={c}' for c in offsets], fontsize=7)
        ax.set_yticks(range(len(offsets)), [f'y={r}' for r in offsets], fontsize=7)
        ax.set_title(VARIANTS[variant].label, fontsize=8)
    fig.colorbar(image, ax=axes[0].tolist(), label='top-1 (%)', shrink=0.85)
    fig.suptitle(f'Accuracy by position: {config.image_size} px images at 3 x 3 offsets (px) on a blank '
                 f'{config.placement_canvas} px canvas (trained at {config.image_size} px, no canvas); '
                 f'{config.placement_images} images, mean ± std over seeds', fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def summarise_probe(results: list[dict], config: StudyConfig) -> list[dict]:
    rows = []
    for variant in config.variants:
        runs = sorted((r for r in results if r['variant'] == variant and 'probe' in r), key=lambda r: r['seed'])
        for size in map(str, config.test_sizes if runs else []):
            r2 = [r['probe']['r2'][size] for r in runs]
            m, sd = mean_std(r2, digits=3)
            rows.append(dict(variant=variant, size=int(size), r2_mean=m, r2_std=sd, r2_per_seed=r2,
                             true_rows=runs[0]['probe']['true_rows'][size],
                             predicted_rows=[round(statistics.mean(v), 4)
                                             for v in zip(*(r['probe']['rows'][size] for r in runs), strict=False)]))
    return rows


def plot_probe(rows: list[dict], config: StudyConfig, path: Path) -> None:
    plt = pyplot()
    cols = min(5, len(config.variants))
    nrows = -(-len(config.variants) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(config.variants):]:
        ax.axis('off')
    for ax, variant in zip(axes.flat, config.variants, strict=False):
        for row in (r for r in rows if r['variant'] == variant):
            ax.plot(row['true_rows'], row['predicted_rows'], marker='.',
                    label=f'{row["size"]} px ({row["size"] // config.patch}x{row["size"] // config.patch}): '
                          f'R² {row["r2_mean"]:.2f}')
        ax.plot([0, 1], [0, 1], color='grey', ls=':', lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel('true relative row of the token')
        ax.set_title(VARIANTS[variant].label, fontsize=8)
        ax.legend(fontsize=6.5, loc='upper left')
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel('position read from its features')
    fig.suptitle('Linear position probe: fitted on final token features at the training size, applied at larger '
                 'sizes (mean over seeds)', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_peg_response(config: StudyConfig, test_image: torch.Tensor, path: Path) -> None:
    """For each PEG variant (lowest seed): the first PEG's response on a blank image and on a test image, at the
    training size and at 2x (resized and on a canvas)."""
    plt = pyplot()
    seed = min(config.seeds)
    variants = [v for v in ('peg_0', 'peg_0-5', 'peg_-1_wide') if v in config.variants
                and (config.run_dir(v, seed) / 'final.pth').is_file()]
    if not variants:
        print(f'[study] no PEG run of seed {seed} has its weights here: {path.name} not drawn')
        return
    big = 2 * config.image_size
    test_image = resize(test_image, config.image_size)
    blank = torch.full_like(test_image, -MEAN / STD)
    inputs = [('blank, 1x', blank), (f'blank, {big} px', resize(blank, big)), ('test image, 1x', test_image),
              (f'test image resized to {big} px', resize(test_image, big)),
              (f'test image on a {big} px canvas', OnCanvas(big).render(test_image, config))]
    fig, axes = plt.subplots(len(variants), len(inputs), figsize=(3.1 * len(inputs), 3 * len(variants)),
                             squeeze=False)
    for row, variant in zip(axes, variants, strict=False):
        model = build_model(variant, config)
        model.load_state_dict(torch.load(config.run_dir(variant, seed) / 'final.pth', map_location='cpu'))
        maps = [peg_response(model, x).numpy() for _, x in inputs]
        vmax = max(float(m.max()) for m in maps)
        for ax, (label, _), response in zip(row, inputs, maps, strict=False):
            image = ax.imshow(response, vmin=0, vmax=vmax, cmap='magma')
            ax.set_title(label, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        row[0].set_ylabel(f'{variant}, seed {seed}', fontsize=8)
        fig.colorbar(image, ax=row.tolist(), shrink=0.8, label='|PEG output| per token')
    fig.suptitle("What the first PEG adds to each token (its zero-padded convolution's output, L2 norm)",
                 fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches='tight')
    plt.close(fig)


def paper(variant: str) -> str:
    value = VARIANTS[variant].paper
    return '—' if value is None else f'{value:.1f}'


def trained_on(results: list[dict]) -> str:
    """Where the runs trained: one device, or each device with its runs when runs that share a study (seeds
    added later, a study over runs of several) trained on different ones."""
    by_device: dict[str, list[str]] = {}
    for r in results:
        by_device.setdefault(r['device'], []).append(f'{r["variant"]} seed {r["seed"]}')
    if len(by_device) == 1:
        return next(iter(by_device))
    return ' and '.join(f'{device} ({len(runs)} run{"s" * (len(runs) > 1)}: {", ".join(runs)})'
                        for device, runs in by_device.items())


@dataclass
class StudyReport:
    """The runs of a study (``results``: their result.json records) under ``config``, with the invocation's
    ``meta`` (command, code, machine, run times), summarised on construction and rendered by ``markdown`` and
    ``write`` (NAME.{json,csv,md,png} and NAME_{placement,probe}.png under ``config.out``)."""
    config: StudyConfig
    results: list[dict]
    meta: dict
    rows: list[dict] = field(init=False)
    placement: list[dict] = field(init=False)
    probe: list[dict] = field(init=False)

    def __post_init__(self):
        self.rows = summarise(self.results, self.config)
        self.placement = summarise_placements(self.results, self.config)
        self.probe = summarise_probe(self.results, self.config)

    def write(self) -> None:
        config = self.config
        figures = {'': lambda path: plot(self.rows, config, path)}
        if self.placement:
            figures['_placement'] = lambda path: plot_placements(self.placement, config, path)
        if self.probe:
            figures['_probe'] = lambda path: plot_probe(self.probe, config, path)
        write_report(config.out, config.name, dict(meta=self.meta, rows=self.rows, placement=self.placement,
                                                   probe=self.probe, runs=self.results),
                     self.markdown(), self.rows, figures)

    def markdown(self) -> str:
        config, meta, rows, placement, probe = self.config, self.meta, self.rows, self.placement, self.probe

        def heading(test):
            grid = f'{test.size // config.patch}x{test.size // config.patch}'
            return f'canvas {test.size} px, {grid}' if isinstance(test, OnCanvas) else \
                f'{test.size} px, {grid} ({test.size / config.image_size:.2g}x)'
        tests = size_tests(config)
        lines = ['| position encoding | paper (DeiT-tiny, ImageNet) | ' + ' | '.join(heading(t) for t in tests)
                 + ' |', '|---|---|' + '---|' * len(tests)]
        for variant in config.variants:
            cells = []
            for row in (r for r in rows if r['variant'] == variant):
                cell = f'{row["top1_mean"]:.2f} ± {row["top1_std"]:.2f}'
                if row['size'] != config.image_size:
                    cell += f' ({row["change_mean"]:+.2f} ± {row["change_std"]:.2f})'
                cells.append(cell)
            lines.append(f'| {VARIANTS[variant].label} | {paper(variant)} | ' + ' | '.join(cells) + ' |')
        if placement:
            spots = [(p.top, p.left) for p in placements(config)]
            lines += ['', f'Accuracy by position on a blank {config.placement_canvas} px canvas (top-left offset y,x '
                      f'in px; first {config.placement_images} test images):', '',
                      '| position encoding | ' + ' | '.join(f'{r},{c}' for r, c in spots) + ' |',
                      '|---|' + '---|' * len(spots)]
            for variant in config.variants:
                lines.append(f'| {VARIANTS[variant].label} | ' + ' | '.join(
                    f'{row["top1_mean"]:.1f} ± {row["top1_std"]:.1f}' for row in placement
                    if row['variant'] == variant) + ' |')
        if probe:
            half = config.probe_images // 2
            lines += ['', 'Position probe R² (relative token position read linearly from the final features; fitted '
                      f'at {config.image_size} px on {half} images, scored on {half} others):',
                      '', '| position encoding | ' + ' | '.join(f'{s} px' for s in config.test_sizes) + ' |',
                      '|---|' + '---|' * len(config.test_sizes)]
            for variant in config.variants:
                lines.append(f'| {VARIANTS[variant].label} | ' + ' | '.join(
                    f'{row["r2_mean"]:.3f} ± {row["r2_std"]:.3f}' for row in probe if row['variant'] == variant) + ' |')
        table = '\n'.join(lines)
        grid = config.image_size // config.patch
        return (
            table + f'\n\nTop-1 (%) on {meta["test_images"]} Fashion-MNIST test images, mean ± standard deviation over '
            f'seeds {meta["seeds"]} (in brackets: change from the training size, paired by seed); head: '
            f'{"class token" if config.head == "cls" else "global average pooling"}. Trained on random resized crops '
            f'(area {config.crop_scale}-1, resampled {config.crop_resample}) of the 28 px originals at '
            f'{config.image_size} px (patch {config.patch}: a {grid} x {grid} token grid), '
            f'{config.dim} wide with {config.heads} heads, peak learning rate {config.lr:g}, weight decay '
            f'{config.weight_decay:g} (position encodings {"included" if config.decay_position else "exempt"}), '
            f'on {meta["train_images"]} images for {config.epochs} epochs ({meta["iterations"]} iterations) on '
            f'{meta["trained_on"]}; tested on the whole images resized ({config.test_resample}). '
            + (f'"canvas": the {config.image_size} px image centred on a blank canvas. ' if config.canvas_sizes else '')
            + f'The paper column is DeiT-tiny\'s '
            f'ImageNet top-1 at 224 from the CPVT paper\'s ablations (—: not in its tables here). Parameters: '
            f'{meta["params"]}. Run time summed over the runs: {meta["run_minutes"]} min (training '
            f'{meta["train_minutes"]}, testing {meta["test_minutes"]}); this invocation: {meta["wall_minutes"]} min.'
            f'\n\n`{meta["command"]}`\n')
