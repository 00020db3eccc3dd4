"""The study's models and their resumable training, tests and position probe, cached per run.

One run is a (variant, seed) of a ``StudyConfig``: ``run`` trains it once (``train``: AdamW with warm-up and
cosine, random resized crops (a share of them blurred up, ``config.blur_up``), checkpoints after every epoch,
resumed from the last), tests it on every test of the config (``specs``) its ``result.json`` lacks, and fits the
position probe. TF32 on a GPU follows ``config.tf32`` (``fp32_precision``) and is recorded.
"""
import math
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.study import records
from benchmarks.study.cnn import PatchCNN
from benchmarks.study.config import TF32, VARIANTS, StudyConfig
from benchmarks.study.data import blur_up, random_resized_crop, resize
from benchmarks.study.specs import OnCanvasAt, TestSpec, parse_key, study_tests
from benchmarks.study.stem import ConvStem, Stemmed
from cpvt_backbones import CPVT
from cpvt_backbones.layers import ConvMlp
from cpvt_backbones.layers.position import peg_responses
from cpvt_backbones.utils import atomic_write


def build_model(variant: str, config: StudyConfig) -> CPVT | PatchCNN | Stemmed:
    """The variant's network (a ``conv_mlp`` variant with ``layers.ConvMlp`` in every block); with ``config.stem``
    on a shared ``ConvStem`` with ``config.stem_layers`` stride-1 layers, normalised where ``config.stem_norm``
    says (the network then has patch size 1 over the stem's map of ``config.dim`` channels)."""
    patch, in_chans = (1, config.dim) if config.stem else (config.patch, config.in_chans)
    if VARIANTS[variant].cnn:
        net = PatchCNN(config.dim, config.depth, patch, in_chans, config.num_classes)
    else:
        spec = VARIANTS[variant].spec(config.image_size, config.patch)
        mlp = dict(mlp_layer=ConvMlp) if VARIANTS[variant].conv_mlp else {}
        net = CPVT(embed_dim=config.dim, depth=config.depth, num_heads=config.heads, patch_size=patch,
                   in_chans=in_chans, num_classes=config.num_classes, class_token=config.head == 'cls',
                   drop_path_rate=config.drop_path, pos_encoding=spec, **mlp)
    if not config.stem:
        return net
    return Stemmed(ConvStem(config.in_chans, config.dim, config.patch, config.stem_layers, config.stem_norm), net)


def make_optimizer(model: CPVT, config: StudyConfig, total_steps: int):
    """AdamW without decay on biases, norms, the class token and (unless ``--decay-position``) the position
    encodings' weights; linear warm-up over ``config.warmup`` of the steps (rounded down, at least one), then
    cosine."""
    skip = model.no_weight_decay()
    if config.decay_position:
        skip = {n for n in skip if n == 'cls_token'}
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and n not in skip]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1 or n in skip]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=config.weight_decay), dict(params=rest, weight_decay=0.)],
                            lr=config.lr)
    warmup = max(1, math.floor(total_steps * config.warmup + 1e-6))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


@contextmanager
def fp32_precision(mode: str):
    """TF32 in CUDA matrix products and cuDNN convolutions while the block runs: ``'on'``, ``'off'`` or
    ``'default'`` (PyTorch's settings left as they are); the previous settings come back on exit. Yields what
    is in force, ``{'matmul': ..., 'cudnn_conv': ...}`` (``'tf32'`` or ``'ieee'``; CPU arithmetic is unaffected)."""
    if mode not in TF32:
        raise ValueError(f'tf32 must be one of {TF32}, got {mode!r}')
    # torch >= 2.9 has the fp32_precision settings; before, the allow_tf32 flags (and ``hasattr`` on the old
    # cuda.matmul object raises AssertionError instead of returning False, so ask torch.backends instead)
    new_api = hasattr(torch.backends, 'fp32_precision')
    if new_api:
        flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        saved = [f.fp32_precision for f in flags]
        if mode != 'default':
            for f in flags:
                f.fp32_precision = 'tf32' if mode == 'on' else 'ieee'
        in_force = [f.fp32_precision if f.fp32_precision != 'none' else torch.backends.fp32_precision
                    for f in flags]
        in_force = ['tf32' if p == 'tf32' else 'ieee' for p in in_force]
    else:
        saved = [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
        if mode != 'default':
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == 'on'
        in_force = ['tf32' if on else 'ieee'
                    for on in (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)]
    try:
        yield dict(matmul=in_force[0], cudnn_conv=in_force[1])
    finally:
        if new_api:
            for f, value in zip((torch.backends.cuda.matmul, torch.backends.cudnn.conv), saved, strict=True):
                f.fp32_precision = value
        else:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@torch.inference_mode()
def evaluate(model: CPVT, x: torch.Tensor, y: torch.Tensor, tests: Sequence[TestSpec], config: StudyConfig,
             batch: int = 250):
    """Top-1 (%) of each test, by its key; placement tests use the first ``config.placement_images`` images."""
    model.eval()
    out = {}
    with fp32_precision(config.tf32):
        for test in tests:
            n = min(len(x), config.placement_images) if isinstance(test, OnCanvasAt) else len(x)
            xs, ys = x[:n], y[:n]
            correct = sum((model(test.render(xs[i:i + batch], config).to(config.device)).argmax(-1).cpu()
                           == ys[i:i + batch]).sum().item() for i in range(0, n, batch))
            out[test.key] = 100. * correct / n
    return out


@torch.inference_mode()
def position_probe(model: CPVT, x: torch.Tensor, config: StudyConfig) -> dict:
    """What the network knows about where a token is, at sizes it never saw.

    A ridge regression from the final patch-token features to the token's relative position in the image
    (row and column centres in 0..1, the same for a given piece of content at every size) is fitted on the
    first half of ``x`` at the training size and scored (R^2) on the second half at every test size. 'rows'
    holds, per test size, the mean predicted relative row of each token row (true centres in 'true_rows').
    A network that encodes relative position keeps R^2 near its 1x value; one that encodes distance from the
    border in tokens does not, since resizing changes that distance."""
    model.eval()
    half = len(x) // 2

    def tokens_and_targets(images: torch.Tensor, size: int):
        tokens = model.forward_features(resize(images, size).to(config.device))[:, model.num_prefix_tokens:].cpu()
        grid = size // config.patch
        centres = (torch.arange(grid) + 0.5) / grid
        target = torch.stack(torch.meshgrid(centres, centres, indexing='ij'), dim=-1).reshape(1, grid * grid, 2)
        return tokens.reshape(-1, tokens.shape[-1]), target.expand(len(images), -1, -1).reshape(-1, 2), grid

    features, targets, _ = tokens_and_targets(x[:half], config.image_size)
    features = torch.cat((features, torch.ones(len(features), 1)), dim=1).double()
    gram = features.T @ features
    weights = torch.linalg.solve(gram + 1e-3 * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype),
                                 features.T @ targets.double())
    out = dict(r2={}, rows={}, true_rows={})
    for size in config.test_sizes:
        features, targets, grid = tokens_and_targets(x[half:], size)
        pred = torch.cat((features, torch.ones(len(features), 1)), dim=1).double() @ weights
        residual = ((pred - targets) ** 2).sum()
        total = ((targets - targets.mean(dim=0)) ** 2).sum()
        out['r2'][str(size)] = round(float(1 - residual / total), 4)
        out['rows'][str(size)] = [round(float(v), 4) for v in pred[:, 0].reshape(-1, grid, grid).mean(dim=(0, 2))]
        out['true_rows'][str(size)] = [round((i + 0.5) / grid, 4) for i in range(grid)]
    return out


def check_steps(steps_per_epoch: int, checks_per_epoch: int) -> list[int]:
    """The steps of an epoch (1-based) after which a check runs: ``checks_per_epoch`` of them, evenly spread,
    the last at the epoch's end."""
    if not 1 <= checks_per_epoch <= steps_per_epoch:
        raise ValueError(f'checks_per_epoch must lie in 1..{steps_per_epoch} (the steps of an epoch), '
                         f'got {checks_per_epoch}')
    return [round(steps_per_epoch * (j + 1) / checks_per_epoch) for j in range(checks_per_epoch)]


def train(variant: str, seed: int, config: StudyConfig, train_data, run_dir: Path,
          after_check: Callable[[torch.nn.Module, int], dict] | None = None, checks_per_epoch: int = 1):
    """Train one model, resuming from its last finished epoch; returns it with its training record (which
    records the TF32 settings in force, ``fp32_precision``). ``after_check(model, check)``, where given, runs
    ``checks_per_epoch`` times an epoch (``check_steps``; the model in eval mode, no gradients; ``check`` counts
    from 1 over the run) and its dict joins the check's entry (``check``, ``epoch``: epochs done, fractional) in
    the record's ``checks``. Checks read no random state, so they leave the training itself unchanged."""
    with fp32_precision(config.tf32) as in_force:
        model, record = _train(variant, seed, config, train_data, run_dir, after_check, checks_per_epoch)
    return model, dict(record, tf32=in_force)


def _train(variant: str, seed: int, config: StudyConfig, train_data, run_dir: Path, after_check=None,
           checks_per_epoch: int = 1):
    x_train, y_train = (t.to(config.device) for t in train_data)
    torch.manual_seed(seed)
    model = build_model(variant, config).to(config.device)
    steps_per_epoch = len(x_train) // config.batch_size
    if steps_per_epoch < 1:
        raise SystemExit(f'[study] --batch-size {config.batch_size} is larger than --train-images {len(x_train)}')
    opt, sched = make_optimizer(model, config, steps_per_epoch * config.epochs)
    checks_at = check_steps(steps_per_epoch, checks_per_epoch) if after_check is not None else []
    gen = torch.Generator().manual_seed(seed)
    state = dict(epoch=0, log=[], checks=[], train_seconds=0.)
    ckpt_path = run_dir / 'checkpoint.pth'
    if ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, weights_only=False, map_location=config.device)
        model.load_state_dict(ckpt['model'])
        opt.load_state_dict(ckpt['optimizer'])
        sched.load_state_dict(ckpt['scheduler'])
        gen.set_state(ckpt['generator'].cpu())
        torch.set_rng_state(ckpt['torch_rng'].cpu())
        state = dict(ckpt['state'], checks=ckpt['state'].get('checks', []))
        print(f'[study] {variant} seed {seed}: resuming after epoch {state["epoch"]}', flush=True)
    for epoch in range(state['epoch'], config.epochs):
        model.train()
        start, loss_sum, correct, check_seconds = time.perf_counter(), 0., 0, 0.
        order = torch.randperm(len(x_train), generator=gen)
        for step in range(steps_per_epoch):
            idx = order[step * config.batch_size:(step + 1) * config.batch_size]
            idx = idx.to(config.device)
            xb = random_resized_crop(x_train[idx], config.image_size, config.crop_scale, gen, config.crop_resample,
                                     config.crop_area)
            if config.blur_up:
                xb = blur_up(xb, [s for s in config.test_sizes if s > config.image_size], config.blur_up, gen)
            yb = y_train[idx]
            logits = model(xb)
            loss = F.cross_entropy(logits, yb, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            correct += (logits.argmax(-1) == yb).sum().item()
            if step + 1 in checks_at:
                check_start = time.perf_counter()
                model.eval()
                with torch.inference_mode():
                    check = len(state['checks']) + 1
                    state['checks'].append(dict(check=check, epoch=round(epoch + (step + 1) / steps_per_epoch, 4),
                                                **after_check(model, check)))
                model.train()
                check_seconds += time.perf_counter() - check_start
        seconds = time.perf_counter() - start - check_seconds
        state['epoch'] = epoch + 1
        state['train_seconds'] += seconds
        state['log'].append(dict(epoch=epoch + 1, loss=round(loss_sum / steps_per_epoch, 4),
                                 train_top1=round(100. * correct / (steps_per_epoch * config.batch_size), 2),
                                 seconds=round(seconds, 1)))
        print(f'[study] {variant} seed {seed}: {state["log"][-1]}', flush=True)
        ckpt = dict(model=model.state_dict(), optimizer=opt.state_dict(), scheduler=sched.state_dict(),
                    generator=gen.get_state(), torch_rng=torch.get_rng_state(), state=state)
        atomic_write(ckpt_path, lambda f, ckpt=ckpt: torch.save(ckpt, f))
    atomic_write(run_dir / 'final.pth', lambda f: torch.save(model.state_dict(), f))
    record = dict(variant=variant, seed=seed, device=config.device, top1={}, epochs=config.epochs,
                  iterations=steps_per_epoch * config.epochs,
                  params=sum(p.numel() for p in model.parameters()), train_seconds=round(state['train_seconds'], 1),
                  eval_seconds=0., log=state['log'])
    if after_check is not None:
        record['checks'] = state['checks']
    return model, record


def run(variant: str, seed: int, config: StudyConfig, data, run_dir: Path) -> dict:
    """One (variant, seed): trained once, then tested on every test this invocation asks for. result.json
    caches both; a test it lacks is run on the saved final weights, so tests can be added to a finished study.
    Where the weights are gone (result.json is kept in git, weights are not), the run is trained again and
    every test of its old result is run again with the new ones on the new weights, so that a result always
    comes from one training (another study sharing the run, such as a test-only variant of a recipe, keeps its
    tests)."""
    result_path = run_dir / 'result.json'
    model, result = None, records.read(result_path)
    probe_sizes = [str(s) for s in config.test_sizes]
    earlier_tests: list[str] = []
    if result is not None and not (run_dir / 'final.pth').is_file() and (
            any(t.key not in result['top1'] for t in study_tests(config))
            or (config.probe_images and sorted(result.get('probe', {}).get('r2', {})) != sorted(probe_sizes))):
        print(f'[study] {variant} seed {seed}: a test is missing and the weights are not here (result.json is '
              'kept in git, weights are not): trained again, its earlier tests run again', flush=True)
        earlier_tests, result = list(result['top1']), None
    if result is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        model, result = train(variant, seed, config, data[0], run_dir)

    def trained() -> CPVT:
        if model is not None:
            return model
        saved = build_model(variant, config)
        saved.load_state_dict(torch.load(run_dir / 'final.pth', map_location='cpu'))
        return saved.to(config.device)

    missing = [t for t in dict.fromkeys([parse_key(k) for k in earlier_tests] + study_tests(config))
               if t.key not in result['top1']]
    changed = bool(missing)
    if missing:
        model = trained()
        start = time.perf_counter()
        result['top1'].update(evaluate(model, *data[1], missing, config))
        result['eval_seconds'] = round(result['eval_seconds'] + time.perf_counter() - start, 1)
        print(f'[study] {variant} seed {seed}: top-1 '
              + ', '.join(f'{t.key} {result["top1"][t.key]:.2f}' for t in missing), flush=True)
    if config.probe_images and sorted(result.get('probe', {}).get('r2', {})) != sorted(probe_sizes):
        with fp32_precision(config.tf32):
            result['probe'] = position_probe(trained(), data[1][0][:config.probe_images], config)
        changed = True
        print(f'[study] {variant} seed {seed}: position probe R^2 {result["probe"]["r2"]}', flush=True)
    if changed:
        records.write(result_path, result)
    return result


def peg_response(model: CPVT, x: torch.Tensor) -> torch.Tensor:
    """What the first PEG adds to each token of the first image (``peg_responses``), an (h, w) map."""
    model.eval()
    return peg_responses(model, x)[0][0]
