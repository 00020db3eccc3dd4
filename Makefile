# Everything runs inside a virtual environment in the repo root that `make env` creates or reuses: .venv/ for the
# default stack, .venv-$(STACK)/ for the others (STACK=upstream | onedl | core | ecosystems; see tools/setup_env.sh).
# PYTHON=python3.12 (any interpreter on PATH) makes the stack's environment with it, in .venv[-STACK]-python3.12/.
STACK ?= default
PYTHON ?=
VENV := $(if $(filter default,$(STACK)),.venv,.venv-$(STACK))$(if $(PYTHON),-$(notdir $(PYTHON)))
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The suite runs on PYTEST_WORKERS pytest-xdist workers (the project's machines have 2 cores; 0 runs it in one
# process), each torch process on one OpenMP thread so that the workers do not compete for the cores. With
# --dist loadgroup the tests of one xdist_group, which share a module fixture's trained or converted model, run on
# one worker.
PYTEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: env test test-quick test-stacks demo bench clean-env

env:
	@STACK=$(STACK) PYTHON=$(PYTHON) VENV_DIR=$(VENV) bash tools/setup_env.sh

test: env
	$(VENV)/bin/ruff check cpvt_backbones tools benchmarks tests
	$(PYTEST) --durations=20 $(PYTEST_ARGS) tests

test-quick: env
	$(VENV)/bin/ruff check cpvt_backbones tools benchmarks tests
	$(PYTEST) -m "not heavy" $(PYTEST_ARGS) tests

# The whole suite on the two other full stacks (each builds its mmcv once, then reuses the cached wheel);
# docs/compatibility.md has their results.
test-stacks:
	$(MAKE) test STACK=upstream
	$(MAKE) test STACK=onedl

demo: env
	$(PY) tools/demo.py

# Speed and memory against mmseg's and timm's PCPVT and onnxruntime on the same weights, in float32, bf16 and int8
# (with glibc's default allocator, then float32 with freed memory retained), the scaling study, and where the time
# goes by kind of op, whole detectors and segmentors end to end on each engine, and OpenVINO's shape strategies on
# streams of mixed and of recurring sizes, and bucketed shapes on a stream of random sizes (docs/performance.md).
bench: env
	$(PY) -m benchmarks.speed pcpvt_small --precision bf16 int8 --engines \
		--json benchmarks/results/bench_pcpvt_small.json
	$(PY) -m benchmarks.speed svt_small --json benchmarks/results/bench_svt_small.json
	$(PY) -m benchmarks.window_mask svt_small --json benchmarks/results/window_mask_svt_small.json
	$(PY) -m benchmarks.speed pcpvt_small --retain-freed-memory \
		--json benchmarks/results/bench_pcpvt_small_retained.json
	$(PY) -m benchmarks.speed pcpvt_small --scaling --json benchmarks/results/scaling_pcpvt_small.json \
		--plot benchmarks/results/scaling_pcpvt_small.png
	$(PY) -m benchmarks.speed pcpvt_small --breakdown --json benchmarks/results/breakdown_pcpvt_small.json
	$(PY) -m benchmarks.speed --end-to-end --precision bf16 int8 --json benchmarks/results/bench_end_to_end.json
	$(PY) -m benchmarks.openvino_shapes --json benchmarks/results/openvino_shapes_pcpvt_small.json
	$(PY) -m benchmarks.bucketed_shapes --json benchmarks/results/bucketed_shapes_pcpvt_small.json

clean-env:
	rm -rf $(VENV)
