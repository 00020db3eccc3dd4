"""The speed benchmark's tables and its scaling plot."""
from pathlib import Path

import torch

from benchmarks.peers import DENSE_PEERS, DENSE_REFERENCE, PEERS, REFERENCE
from cpvt_backbones.utils import pyplot


def _fmt(value, spec: str) -> str:
    return '-' if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    """The backbone: the reference (the fused engine) and its peers; ``x peer`` is the peer's time over the
    reference's."""
    ref = REFERENCE
    lines = [f'| case | shape | {ref} s | ' + ' | '.join(f'{p} s' for p in PEERS) + ' | '
             + ' | '.join(f'x {p}' for p in PEERS) + f' | {ref} img/s | GFLOPs | % of matmul | peak MiB {ref} / '
             + ' / '.join(PEERS) + f' | page faults per call, thousands, {ref} / ' + ' / '.join(PEERS)
             + ' | max diff ' + ' / '.join(PEERS) + ' |',
             '|---|---|---|' + '---|' * (2 * len(PEERS)) + '---|---|---|---|---|---|']
    for r in rows:
        times = ' | '.join(_fmt(r[f'{p}_s'], '.3f') for p in PEERS)
        ratios = ' | '.join(_fmt(r[f'{p}_s'] / r[f'{ref}_s'] if r[f'{p}_s'] else None, '.2f') for p in PEERS)
        peaks = ' / '.join(_fmt(r[f'{k}_peak_mb'], '.0f') for k in (ref,) + PEERS)
        faults = ' / '.join(_fmt(r[f'{k}_faults'] / 1e3 if r[f'{k}_faults'] is not None else None, '.0f')
                            for k in (ref,) + PEERS)
        diffs = ' / '.join(_fmt(r[f'max_abs_diff_{p}'], '.1e') for p in PEERS)
        lines.append(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | {r[f'{ref}_s']:.3f} | {times} | {ratios} "
                     f"| {r['shape'][0] / r[f'{ref}_s']:.2f} | {r['gflops']:.1f} "
                     f"| {100 * r['fraction_of_matmul']:.0f}% | {peaks} | {faults} | {diffs} |")
    return '\n'.join(lines)


def dense_table(rows: list[dict]) -> str:
    """End to end: seconds per call of each implementation, its speed-up over the reference (torch float32, the
    model as it is), its build time (conversion, quantization, compilation) and its first call at the case's
    shape."""
    ref = DENSE_REFERENCE
    impls = (ref,) + DENSE_PEERS
    lines = ['| model | input | ' + ' | '.join(f'{p} s (x {ref})' for p in impls) + ' | build s '
             + ' / '.join(DENSE_PEERS) + ' | first call s ' + ' / '.join(impls) + f' | max diff from {ref} |',
             '|---|---|' + '---|' * len(impls) + '---|---|---|']
    for r in rows:
        times = ' | '.join('-' if r[f'{p}_s'] is None else f"{r[f'{p}_s']:.3f} ({r[f'{ref}_s'] / r[f'{p}_s']:.2f}x)"
                           for p in impls)
        build = ' / '.join(_fmt(r['setup_s'].get(p), '.1f') for p in DENSE_PEERS)
        first = ' / '.join(_fmt(r['first_call_s'].get(p), '.2f') for p in impls)
        diffs = ' / '.join(_fmt(r[f'max_abs_diff_{p}'], '.1e') for p in DENSE_PEERS)
        lines.append(f"| {r['model']} | {'x'.join(map(str, r['shape']))} | {times} | {build} | {first} | {diffs} |")
    return '\n'.join(lines)


def scaling_table(rows: list[dict]) -> str:
    lines = ['| input | megapixels | s | s per megapixel | peak MiB | GFLOPs | attention share |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['size']}x{r['size']} | {r['megapixels']:.3f} | {r['seconds']:.3f} "
                     f"| {r['seconds'] / r['megapixels']:.2f} | {_fmt(r['peak_mb'], '.0f')} | {r['gflops']:.1f} "
                     f"| {100 * r['attention_share']:.0f}% |")
    return '\n'.join(lines)


def breakdown_table(rows: list[dict]) -> str:
    kinds = list(rows[0]['kinds'])
    lines = ['| case | s (profiled) | % of matmul | ' + ' | '.join(f'{k}: time share, % of matmul' for k in kinds)
             + ' | ceiling (rest free) |', '|---|---|---|' + '---|' * len(kinds) + '---|']
    for r in rows:
        cells = [f"{100 * v['share']:.0f}%, " + ('-' if v['fraction_of_matmul'] is None else
                                                 f"{100 * v['fraction_of_matmul']:.0f}%") for v in r['kinds'].values()]
        lines.append(f"| {r['name']} | {r['seconds']:.3f} | {100 * r['fraction_of_matmul']:.0f}% | "
                     + ' | '.join(cells) + f" | {100 * r['ceiling']:.0f}% |")
    return '\n'.join(lines)


def plot_scaling(rows: list[dict], path: Path, name: str) -> None:
    plt = pyplot()
    mp = [r['megapixels'] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    for ax, key, label in ((axes[0], 'seconds', 'time per image (s)'), (axes[1], 'peak_mb', 'peak memory (MiB)')):
        values = [r[key] for r in rows]
        ax.loglog(mp, values, marker='o', label=name)
        ax.loglog(mp, [values[0] * m / mp[0] for m in mp], '--', color='grey', label='linear in pixels')
        ax.loglog(mp, [values[0] * (m / mp[0]) ** 2 for m in mp], ':', color='grey', label='quadratic in pixels')
        ax.set_xlabel('input megapixels')
        ax.set_ylabel(label)
        ax.set_ylim(min(values) / 2, max(values) * 2)
        ax.grid(alpha=.3, which='both')
        ax.legend(fontsize=8)
    fig.suptitle(f'{name} features, batch 1, {torch.get_num_threads()} threads', fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
