# Everything runs inside .venv/ in the repo root; `make env` creates or reuses it (see tools/setup_env.sh).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: env test test-quick demo clean-env

env:
	@bash tools/setup_env.sh

test: env
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests

test-quick: env
	$(PY) -m pytest -q -p no:cacheprovider -m "not heavy" $(PYTEST_ARGS) tests

demo: env
	$(PY) tools/demo.py

clean-env:
	rm -rf .venv
