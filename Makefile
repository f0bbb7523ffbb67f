# Decision Index runner. `make run` and `make test` install what they need first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= ../shared/data
CACHE  ?= .dxi-cache
OUT    ?= out
MODEL  ?= embedded:sparrow-nano-general-v1.1

.PHONY: install run smoke score test lint bench clean

install: $(VENV)/.installed

# uv installs in a few seconds what pip takes ~20 s for; pip alone is the fallback. Bytecode is compiled
# at install (as pip does), so that no run pays for it: dxi's start-up drops from ~1.8 s to ~1.0 s.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/pip install --quiet --disable-pip-version-check uv && \
	  $(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -e '.[test]' ) || \
	  $(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

# The whole Decision Index on the embedded decision model (no key, no network).
run: install
	$(BIN)/dxi run --model $(MODEL) --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)

# Five tasks of each evaluation, for a quick check.
smoke: install
	$(BIN)/dxi run --model $(MODEL) --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)/smoke --limit 5

# Rescore every model in the cache, without the network.
score: install
	$(BIN)/dxi score --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)

test: install
	$(BIN)/pytest

# Every benchmarks/bench_*.py, measured side by side; results in out/bench/.
bench: install
	$(BIN)/python -m benchmarks

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(CACHE) $(OUT) .pytest_cache
