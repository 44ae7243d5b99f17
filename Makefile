# Moir Lab. Every target sets up .venv itself on a fresh machine.
#   make book   execute every chapter on the pocket default + build _build/html
#   make test   the default test tier (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.moir-installed
# torch first, pinned: here it is a local CPU wheel; an unpinned torch pulls GBs of CUDA.
TORCH ?= torch==2.13.0
# nbval on the committed notebooks: the model-free chapter in the default tier; every chapter on
# its (pocket) defaults in test-slow. Model chapters run in the default tier through papermill
# with the micro model (tests/test_chapters_*.py, tests/test_tracing.py).
NBVAL_FAST := notebooks/04_g_cancellation.ipynb
# One torch thread: on two shared cores the small pocket models run several times faster so.
export OMP_NUM_THREADS ?= 1
PYTEST_ENV := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

.PHONY: setup book test test-slow test-book bench lint lab clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --progress-bar off --upgrade pip
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q --progress-bar off "$(TORCH)"
	$(BIN)/python -m pip install -q --progress-bar off -e ".[dev,book]"
	@touch $@

book: $(STAMP)
	$(BIN)/moir book

test: $(STAMP)
	$(PYTEST_ENV) $(BIN)/python -m pytest -m "not slow and not book" --nbval-lax tests $(NBVAL_FAST)

test-book: $(STAMP)
	$(PYTEST_ENV) $(BIN)/python -m pytest -m book tests/test_browser.py

test-slow: $(STAMP)
	$(PYTEST_ENV) $(BIN)/python -m pytest -m slow tests
	$(PYTEST_ENV) $(BIN)/python -m pytest --nbval-lax notebooks

bench: $(STAMP)
	@shopt -s nullglob; for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check moir_lib tests benchmarks
	$(BIN)/moir nbcheck notebooks/*.ipynb

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _build runs .pytest_cache
