"""One run of the study: trained once and tested at its selected checks (``run``), or a run of a trained study
validated (``revalidate``) and tested (``retest``) again; each record written whole under the run's folder, the
checks' weights under its checks/."""
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.native_detail.design import MATCHED_LEVEL, TEST_SEED, TESTS, TRAIN_SIZE, test_images
from benchmarks.native_detail.selection import run_checks, window
from benchmarks.study import records
from benchmarks.study.config import StudyConfig
from benchmarks.study.specs import Given
from benchmarks.study.trainer import build_model, evaluate, train
from cpvt_backbones.utils import atomic_write


def check_path(config: StudyConfig, variant: str, seed: int, check: int) -> Path:
    return config.run_dir(variant, seed) / 'checks' / f'{check:03d}.pth'


def run(variant: str, seed: int, config: StudyConfig, data, origin: dict | None = None,
        checks_per_epoch: int = 4, smooth: int = 3, level: float = MATCHED_LEVEL, match: str = 'first') -> dict:
    """One (variant, seed) trained once (resumable), then tested: its validation top-1 at every check in the
    record's ``checks`` (each check's weights under its run's checks/), and every test (``data[2]``) at its
    final and matched checks (``run_checks`` with ``smooth``, ``level`` and ``match``) in its ``tests``; the record
    holds ``origin`` (``provenance``), ``smooth``, ``level`` and ``match``."""
    run_dir = config.run_dir(variant, seed)
    result_path = run_dir / 'result.json'
    if (done := records.read(result_path)) is not None:
        return done
    if origin is None:
        raise ValueError(f'{variant} seed {seed} is not trained yet: training needs its provenance (origin)')
    records.start_on(run_dir, dict(accelerator=origin['accelerator']), 'native', f'{variant} seed {seed}')
    (run_dir / 'checks').mkdir(exist_ok=True)
    x_val, y_val = data[1]

    def after_check(model, check: int) -> dict:
        atomic_write(check_path(config, variant, seed, check), lambda f: torch.save(model.state_dict(), f))
        val = evaluate(model, x_val, y_val, [Given(TRAIN_SIZE)], config)[Given(TRAIN_SIZE).key]
        print(f'[native] {variant} seed {seed} check {check}: validation {val:.2f}', flush=True)
        return dict(val=round(val, 2))

    start = time.perf_counter()
    model, result = train(variant, seed, config, data[0], run_dir, after_check, checks_per_epoch)
    chosen = sorted(set(run_checks(result['checks'], smooth, level, match).values()))
    result['tests'] = test_checks(model, variant, seed, config, chosen, data[2])
    seconds = time.perf_counter() - start - result['train_seconds']
    result.update(eval_seconds=round(max(seconds, 0.), 1), smooth=smooth, level=level, match=match, **origin)
    return records.write(result_path, result)


def weights_at(model, variant: str, seed: int, trained: StudyConfig, checks: Sequence[int]):
    """Each of ``checks`` in turn, ``model`` holding that check's weights from the run of ``trained``."""
    for check in checks:
        model.load_state_dict(torch.load(check_path(trained, variant, seed, check), map_location=trained.device))
        yield check


def test_checks(model, variant: str, seed: int, trained: StudyConfig, checks: Sequence[int], drawings: dict) -> dict:
    """Every test (``TESTS``, on ``load_tests``' ``drawings``) of ``model`` at each of ``checks``, its weights read
    from the run of ``trained``: ``{str(check): {test key: top-1}}``."""
    tests = {}
    for check in weights_at(model, variant, seed, trained, checks):
        top1 = {t.key: evaluate(model, *test_images(t, drawings), [t], trained)[t.key] for t in TESTS}
        tests[str(check)] = {k: round(v, 2) for k, v in top1.items()}
        print(f'[native] {variant} seed {seed} check {check}: ' + ', '.join(f'{k} {v:.2f}' for k, v in top1.items()),
              flush=True)
    return tests


def _trained_here(trained: dict, source: StudyConfig, origin: dict, checks: Sequence[int]) -> None:
    """``records.trained_here`` for the run ``trained`` of ``source`` and the weights of ``checks``."""
    weights = [check_path(source, trained['variant'], trained['seed'], i) for i in checks]
    records.trained_here(trained, origin, weights, 'native', source.name)


def revalidate(variant: str, seed: int, config: StudyConfig, source: StudyConfig, data, origin: dict,
               val_seed: int) -> dict:
    """The validation top-1 of every check of a run of ``source`` on ``data`` (``load_validation``'s set
    ``val_seed``), kept as the run's validation.json (``{variant, seed, checks: [{check, epoch, val}], val_seed,
    val_images, val_seconds}`` and ``origin``); read back where it is there already."""
    path = config.run_dir(variant, seed) / 'validation.json'
    if (done := records.read(path)) is not None:
        return done
    trained = run(variant, seed, source, None)
    checks = trained['checks']
    _trained_here(trained, source, origin, [c['check'] for c in checks])
    model = build_model(variant, config).to(config.device)
    epochs, curve, start = {c['check']: c['epoch'] for c in checks}, [], time.perf_counter()
    for check in weights_at(model, variant, seed, source, list(epochs)):
        val = evaluate(model, *data, [Given(TRAIN_SIZE)], config)[Given(TRAIN_SIZE).key]
        curve.append(dict(check=check, epoch=epochs[check], val=round(val, 2)))
    print(f'[native] {variant} seed {seed}: validated on set {val_seed} at {len(curve)} checks', flush=True)
    return records.write(path, dict(variant=variant, seed=seed, checks=curve, val_seed=val_seed,
                                    val_images=len(data[1]), val_seconds=round(time.perf_counter() - start, 1),
                                    **origin))


def retest(variant: str, seed: int, config: StudyConfig, source: StudyConfig, data, origin: dict | None = None,
           smooth: int = 3, level: float = MATCHED_LEVEL, width: int = 3, test_seed: int = TEST_SEED,
           validation: dict | None = None, match: str = 'first') -> dict:
    """One run of the study ``source``, trained already (its record in git, its checks' weights on this machine),
    tested again on ``data`` (``load_tests``' drawings of the scene set ``test_seed``): every test at every check
    in the windows of ``width`` checks centred on its final and matched checks (``run_checks`` with ``smooth``,
    ``level`` and ``match`` on its recorded validation, or on ``validation``'s curve where given: ``revalidate``'s).
    The record holds the validation curve selection read, the source run's training log, what trained it
    (``trained``: study, commit, torch), ``validation``'s set where given and this invocation's ``origin``; a run
    is tested on the accelerator that trained it."""
    result_path = config.run_dir(variant, seed) / 'result.json'
    if (done := records.read(result_path)) is not None:
        return done
    if origin is None:
        raise ValueError(f'{variant} seed {seed} is not tested yet: testing needs its provenance (origin)')
    trained = run(variant, seed, source, None)
    checks = (validation or trained)['checks']
    ids = sorted({i for check in run_checks(checks, smooth, level, match).values()
                  for i in window(checks, check, width)})
    _trained_here(trained, source, origin, ids)
    start = time.perf_counter()
    tests = test_checks(build_model(variant, config).to(config.device), variant, seed, source, ids, data)
    result = {k: trained[k] for k in ('variant', 'seed', 'device', 'epochs', 'iterations', 'params', 'train_seconds',
                                      'log', 'tf32')}
    result.update(checks=checks, tests=tests, eval_seconds=round(time.perf_counter() - start, 1), smooth=smooth,
                  level=level, match=match, window=width, test_seed=test_seed,
                  **({k: validation[k] for k in ('val_seed', 'val_images', 'val_seconds')} if validation else {}),
                  trained=dict(study=source.name, **{k: trained[k] for k in ('commit', 'torch', 'source_digest')}),
                  **origin)
    return records.write(result_path, result)
