"""A study's settings: one frozen ``StudyConfig`` whose defaults are the resolution study's, the table of position
encodings (``VARIANTS``) it compares, and the command line that gives a config.

A recipe is the default config with fields replaced (``config.replace(lr=2e-3)``); ``command_args`` writes any
config back as ``benchmarks.resolution_study`` options, so a study run from a config records the command that
reproduces it.
"""
import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from benchmarks.study.common import study_dir
from cpvt_backbones.datasets.fashion_mnist import DEFAULT_ROOT

ROOT = Path(__file__).resolve().parents[2]
CROP_RESAMPLE = ('antialiased', 'aliased')
CROP_AREA = ('uniform', 'log')
TEST_RESAMPLE = ('bilinear', 'bicubic')
TF32 = ('default', 'on', 'off')


class Variant(NamedTuple):
    label: str
    paper: float | None      # DeiT-tiny, ImageNet top-1 at 224 (CPVT paper); None: not in its table
    spec: Callable[[int, int], object]   # (training image size in px, patch) -> pos_encoding
    cnn: bool = False           # the positive control: cnn.PatchCNN instead of the ViT (spec unused)
    conv_mlp: bool = False      # every block's MLP is PVTv2's convolutional one (layers.ConvMlp)


# The rows of the CPVT paper's position-encoding ablation (DeiT-tiny on ImageNet, class token), in its order,
# then 2-D RoPE (Heo et al.) alone and with a PEG. "At -1" acts on the patch embedding's output; "after 0" on
# block 0's. The wide PEG's kernel spans the whole grid from any token (2 * grid - 1: the paper's 27 at 14 x 14).
VARIANTS: dict[str, Variant] = {
    'none': Variant('no position encoding', 68.2, lambda size, patch: 'none'),
    'learned': Variant('learned table, resized (DeiT)', 72.2,
                       lambda size, patch: dict(type='learned', img_size=size)),
    'sincos': Variant('2-D sin-cos table', 72.3, lambda size, patch: 'sincos'),
    'rpe': Variant('relative position bias (K = 8)', 70.5, lambda size, patch: dict(type='rpe', max_distance=8)),
    'peg_-1': Variant('PEG at -1', 70.6, lambda size, patch: dict(type='peg', positions=(-1,))),
    'peg_-1_wide': Variant('PEG at -1, (2g-1)^2 kernel', 72.5, lambda size, patch: dict(
        type='peg', positions=(-1,), kernel_size=2 * (size // patch) - 1)),
    'peg_0': Variant('PEG after block 0 (CPVT)', 72.4, lambda size, patch: dict(type='peg', positions=(0,))),
    'peg_0-5': Variant('PEG after blocks 0-5 (CPVT)', 73.4,
                       lambda size, patch: dict(type='peg', positions=tuple(range(6)))),
    'peg_0-5_circular': Variant('PEG after blocks 0-5, circular padding (no border)', None,
                                lambda size, patch: dict(type='peg', positions=tuple(range(6)),
                                                         padding_mode='circular')),
    'peg_frozen': Variant('PEG after 0, frozen random', 71.3,
                          lambda size, patch: dict(type='peg', positions=(0,), frozen=True)),
    'peg_qk': Variant('PEG on Q, K only (block 1)', 71.3, lambda size, patch: dict(type='peg_qk', positions=(1,))),
    'conv1x1': Variant('1x1 convs after every block', 68.6, lambda size, patch: 'conv1x1'),
    'learned+peg_0': Variant('learned table + PEG after 0', None, lambda size, patch: [
        dict(type='learned', img_size=size), dict(type='peg', positions=(0,))]),
    'rope_axial': Variant('RoPE-Axial', None, lambda size, patch: 'rope_axial'),
    'rope_mixed': Variant('RoPE-Mixed', None, lambda size, patch: 'rope_mixed'),
    'rope_mixed+peg_0': Variant('RoPE-Mixed + PEG after 0', None,
                                lambda size, patch: ['rope_mixed', dict(type='peg', positions=(0,))]),
    'cnn': Variant('CNN, no position encoding (control)', None, lambda size, patch: None, cnn=True),
    'conv_mlp': Variant('convolutional MLP in every block, no PEG (PVTv2)', None, lambda size, patch: 'none',
                        conv_mlp=True),
}
# The position encodings' variants (a plain MLP in every block): the resolution study's default grid.
VIT_VARIANTS = tuple(v for v in VARIANTS if not VARIANTS[v].cnn and not VARIANTS[v].conv_mlp)


@dataclass(frozen=True)
class StudyConfig:
    """A study's settings; ``benchmarks.resolution_study``'s options of the same names document each field
    (``shard_index``/``num_shards`` are its ``--shard K/N``). Constructing one checks it: a ValueError names a
    setting the study cannot run. ``runs`` is the directory of the trained runs under ``work_dir`` (None: the
    name), so that studies that differ only in test-time fields share them."""
    name: str = 'resolution_study'
    variants: tuple[str, ...] = VIT_VARIANTS
    head: str = 'cls'
    seeds: tuple[int, ...] = (0, 1, 2)
    train_images: int = 20000
    test_images: int = 5000
    image_size: int = 14
    test_sizes: tuple[int, ...] = (14, 20, 28, 42)
    canvas_sizes: tuple[int, ...] = ()
    placement_canvas: int = 0
    placement_images: int = 1000
    probe_images: int = 1000
    epochs: int = 4
    batch_size: int = 128
    lr: float = 1e-3
    warmup: float = 0.1        # the linear warm-up's share of the schedule's steps (rounded down, at least one)
    weight_decay: float = 0.05
    drop_path: float = 0.1
    crop_scale: float = 0.25
    crop_resample: str = 'antialiased'
    crop_area: str = 'uniform'
    blur_up: float = 0.        # the share of training crops drawn coarser and upsampled (trainer, data.blur_up)
    test_resample: str = 'bilinear'
    decay_position: bool = False
    dim: int = 64
    depth: int = 6
    heads: int = 2
    patch: int = 2
    stem: bool = False         # a convolutional stem (stem.ConvStem, circular padding) in place of the patch embedding
    stem_layers: int = 0       # the stem's 3 x 3 stride-1 layers after its stride-2 ones (stem only)
    stem_norm: bool = False    # BatchNorm after every stem convolution (stem only)
    in_chans: int = 1          # the images' channels and classes (Fashion-MNIST: 1 and 10); other tasks
    num_classes: int = 10      # of the same models replace them
    device: str = 'cpu'
    tf32: str = 'default'
    data: Path = DEFAULT_ROOT
    work_dir: Path = field(default_factory=lambda: study_dir('resolution_study'))
    out: Path = ROOT / 'benchmarks/results'
    runs: str | None = None
    shard_index: int = 0
    num_shards: int = 1

    def __post_init__(self):
        for name in ('variants', 'seeds', 'test_sizes', 'canvas_sizes'):   # lists given are kept as tuples
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ('data', 'work_dir', 'out'):
            object.__setattr__(self, name, Path(getattr(self, name)))
        problem = self._problem()
        if problem:
            raise ValueError(problem)

    def _problem(self) -> str | None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        choices = dict(head=('cls', 'gap'), crop_resample=CROP_RESAMPLE, crop_area=CROP_AREA,
                       test_resample=TEST_RESAMPLE, tf32=TF32)
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                return f'{name} must be one of {allowed}, got {getattr(self, name)!r}'
        sizes = (self.image_size, *self.test_sizes, *self.canvas_sizes)
        checks = [
            (bool(unknown), f'unknown variant(s) {unknown}: one of {", ".join(VARIANTS)}'),
            (not self.variants or not self.seeds, 'a study needs at least one variant and one seed'),
            (not 0 <= self.shard_index < self.num_shards,
             f'shard must be K/N with 0 <= K < N, got {self.shard_index}/{self.num_shards}'),
            (any(s % self.patch for s in sizes), f'size {next((s for s in sizes if s % self.patch), 0)} is not a '
             f'multiple of the patch size {self.patch} (the study avoids padding)'),
            (self.image_size not in self.test_sizes,
             f'test_sizes must include the training size {self.image_size} (changes are measured from it)'),
            (self.head != 'gap' and any(VARIANTS[v].cnn for v in self.variants if v in VARIANTS),
             'variant cnn pools its feature map (no class token): it needs head gap'),
            (self.depth < 6 and 'peg_0-5' in self.variants, f'variant peg_0-5 needs depth >= 6, got {self.depth}'),
            (any(s <= self.image_size for s in self.canvas_sizes + (self.placement_canvas or self.image_size + 1,)),
             f'canvas_sizes and placement_canvas must be larger than the training size {self.image_size}'),
            (self.placement_canvas % self.patch,
             f'placement_canvas {self.placement_canvas} is not a multiple of the patch size {self.patch}'),
            (not 0 < self.crop_scale <= 1, f'crop_scale must be in (0, 1], got {self.crop_scale}'),
            (not 0 <= self.warmup <= 1, f'warmup must be in [0, 1] (a share of the steps), got {self.warmup}'),
            (not 0 <= self.blur_up <= 1, f'blur_up must be in [0, 1] (a share of the crops), got {self.blur_up}'),
            (self.blur_up > 0 and not any(s > self.image_size for s in self.test_sizes),
             f'blur_up draws crops as the upsampled tests do: it needs a test size above {self.image_size}'),
            (self.stem_layers < 0 or (self.stem_layers and not self.stem),
             f'stem_layers must be >= 0 and needs the convolutional stem (stem), got {self.stem_layers}'),
            (self.stem_norm and not self.stem, 'stem_norm needs the convolutional stem (stem)'),
            (self.stem and (self.patch < 2 or self.patch & (self.patch - 1)),
             f'the convolutional stem halves the image per layer: it needs a patch size 2, 4, 8, ..., got '
             f'{self.patch}'),
        ]
        return next((message for failed, message in checks if failed), None)

    @property
    def run_set(self) -> str:
        """The directory of the trained runs under ``work_dir``."""
        return self.runs or self.name

    def run_dir(self, variant: str, seed: int) -> Path:
        """Where one (variant, seed) run keeps its checkpoints, weights and result.json."""
        return self.work_dir / self.run_set / f'{variant}-seed{seed}'

    def replace(self, **changes) -> 'StudyConfig':
        """This config with ``changes`` (field names) replaced, checked again."""
        return dataclasses.replace(self, **changes)


def option(name: str) -> str:
    """The resolution study's option for a field: 'train_images' -> '--train-images'."""
    return '--' + name.replace('_', '-')


def command_args(config: StudyConfig) -> list[str]:
    """``benchmarks.resolution_study`` options that give ``config`` (its fields that differ from the defaults)."""
    default, args = StudyConfig(), []
    for f in dataclasses.fields(StudyConfig):
        value = getattr(config, f.name)
        if f.name in ('in_chans', 'num_classes', 'shard_index', 'num_shards') or value == getattr(default, f.name):
            continue   # the first two are no options (other tasks set them); the shard is one option, below
        if isinstance(value, bool):
            args.append(option(f.name))
        elif isinstance(value, tuple):
            args += [option(f.name), *map(str, value)]
        else:
            args += [option(f.name), str(value)]
    if config.num_shards > 1:
        args += ['--shard', f'{config.shard_index}/{config.num_shards}']
    return args


def parse_fields(pairs: Sequence[str]) -> dict:
    """``['lr=2e-3', 'test_sizes=14,28', 'decay_position=true']`` -> field values of their types; a ValueError
    naming a pair that is no field or whose value does not parse."""
    fields = {f.name: f for f in dataclasses.fields(StudyConfig)}
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition('=')
        if not sep or name not in fields:
            raise ValueError(f'{pair!r}: expected FIELD=VALUE with a StudyConfig field ({", ".join(fields)})')
        kind = fields[name].type
        try:
            if kind is bool:
                if text.lower() not in ('true', 'false'):
                    raise ValueError('true or false')
                out[name] = text.lower() == 'true'
            elif typing.get_origin(kind) is tuple:
                element = typing.get_args(kind)[0]
                out[name] = tuple(element(v) for v in text.split(',') if v)
            elif kind in (int, float, str, Path):
                out[name] = kind(text)
            else:   # optional strings (runs)
                out[name] = text or None
        except ValueError as e:
            raise ValueError(f'{pair!r}: {name} takes {getattr(kind, "__name__", kind)} ({e})') from e
    return out
