# Decision Index runner. `make run` and `make test` install what they need first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= $(or $(DXI_DATA_DIR),../shared/data)
CACHE  ?= .dxi-cache
OUT    ?= out
MODEL  ?= embedded:sparrow-nano-general-v1.1
LLM    ?= qwen2.5-coder-0.5b
LLM_SAMPLE ?= 10
LIMIT  ?=
SAMPLE ?=
SEED   ?= 0
JOBS   ?= auto
# what `dxi score` / `dxi report` read: the first LIMIT tasks, or the stratified SAMPLE (seed SEED)
SUBSET  = $(if $(LIMIT),--limit $(LIMIT)) $(if $(SAMPLE),--sample $(SAMPLE) --seed $(SEED))

.PHONY: help install install-llm model run run-llm smoke score report test test-quick test-fast lint format bench docs clean

# The targets, each with the comment above it.
help:
	@awk '/^# /{c = c substr($$0, 3) " "} /^[a-z-]+:/{if (c) printf "%-12s %s\n", $$1, c; c = ""} /^$$/{c = ""}' \
	  $(MAKEFILE_LIST)

install: $(VENV)/.installed
	@echo "dxi is installed in $(VENV)/bin. Put it on PATH with:  source $(VENV)/bin/activate"

# uv installs in a few seconds what pip takes ~20 s for; pip alone is the fallback. Bytecode is compiled
# at install (as pip does), so that no run pays for it: dxi's start-up drops from ~1.8 s to ~1.0 s.
# The `dxi` script then starts Python with SIGINT and SIGTERM blocked, through GNU env's
# --block-signal (coreutils 9 and later; elsewhere the script stays as written): a Ctrl-C while the
# interpreter starts (its own modules, site, the editable install's finder: ~30 ms) is held until
# dxi.__main__ has put its handler in place, then ends dxi with one line and exit code 130, never a
# traceback (docs/cli.md). Every install below writes the script again, then this.
HOLD = -S --block-signal=INT --block-signal=TERM
SIGNALS_HELD = if env --block-signal=INT true 2>/dev/null && \
	  ! head -1 $(BIN)/dxi | grep -q block-signal; then \
	  sed -i "1s|^\#!\(/.*\)|\#!$$(command -v env) $(HOLD) \1|" $(BIN)/dxi; fi

# The project's own modules and the tests' as bytecode (pip and uv compile only site-packages):
# what a test run's processes import, compiled once (a no-op for the files already compiled).
COMPILE = $(BIN)/python -m compileall -q -j 0 dxi runner adapters scoring cache evals report view tests

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/pip install --quiet --disable-pip-version-check uv && \
	  $(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -e '.[test]' ) || \
	  $(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	$(SIGNALS_HELD)
	touch $@

# The optional extra for the local language model (xllamacpp, a 32 MB CPU wheel); `make run` does without.
install-llm: $(VENV)/.installed-llm

$(VENV)/.installed-llm: $(VENV)/.installed
	$(BIN)/uv pip install --python $(BIN)/python --quiet -e '.[test,local-llm]' || \
	  $(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,local-llm]'
	$(SIGNALS_HELD)
	touch $@

# The local model's GGUF file, fetched once per machine into ~/.cache/decision-index/models (checked by sha256).
model: $(VENV)/.installed
	$(BIN)/dxi fetch-model $(LLM)

# The local language model in both modes (structured outputs, logprob decisions) beside the embedded
# decision model, on a stratified sample of LLM_SAMPLE tasks of each evaluation (seed SEED; every gold
# class present, so the table separates the models); LLM_SAMPLE= for the whole index: hours.
run-llm: install-llm model
	$(BIN)/dxi run --model $(MODEL) --model llamacpp:$(LLM) --model llamacpp-logprobs:$(LLM) \
	  --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)/llm $(if $(LLM_SAMPLE),--sample $(LLM_SAMPLE) --seed $(SEED))

# The whole Decision Index on the embedded decision model (no key, no network).
run: $(VENV)/.installed
	$(BIN)/dxi run --model $(MODEL) --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)

# A quick check: a stratified sample of 10 tasks of each evaluation (every gold class present).
smoke: $(VENV)/.installed
	$(BIN)/dxi run --model $(MODEL) --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)/smoke --sample 10 --seed $(SEED)

# Rescore every model in the cache, without the network: the tasks the runs selected (LIMIT=N: the first N
# tasks of each evaluation; SAMPLE=N [SEED=S]: the stratified sample, e.g. SAMPLE=10 OUT=out/llm).
score: $(VENV)/.installed
	$(BIN)/dxi score --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT) $(SUBSET)

# Rescore and write the HTML report with CSV/Parquet tables (out/report.html, out/tables/); LIMIT, SAMPLE as above.
report: $(VENV)/.installed
	$(BIN)/dxi report --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT) $(SUBSET)

# Every test, the real local language model's included (installs the extra and fetches the model once),
# on JOBS processes (pytest-xdist: tests go to whichever is free; tests marked with one xdist_group share one).
# The project's own modules are compiled to bytecode first (COMPILE): with PYTHONDONTWRITEBYTECODE set,
# as under CI here, every dxi the tests start compiled ~100 of them again (~0.2 s a process).
test: install-llm model
	$(COMPILE)
	$(BIN)/pytest -n $(JOBS) --dist loadgroup

# Every test but the local language model's.
test-quick: $(VENV)/.installed
	$(COMPILE)
	$(BIN)/pytest -m "not local_llm"

# The inner loop (≤ 3 minutes on 2 cores): the library and unit tests, none marked server (Redis, Slurm,
# moto, Chromium, zsh/fish), process (dxi or a fake in a process of its own), slow, local_llm or wheel;
# it names at the end any test of that set over 2 s (mark it). `make test` is still the whole suite.
test-fast: $(VENV)/.installed
	$(COMPILE)
	$(BIN)/pytest --fast -n $(JOBS) --dist loadgroup

# Every benchmarks/bench_*.py, measured side by side; results in out/bench/.
bench: $(VENV)/.installed
	$(BIN)/python -m benchmarks

# The linter, the layout (ruff format at 100 columns), the docstrings and comments re-filled
# (tools/rewrap.py) and at most 1% of the lines over 100 columns.
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/rewrap.py --check .
	$(BIN)/python tools/rewrap.py --budget 1 .

# Lay every .py file out at 100 columns: imports sorted, ruff format, the docstring and comment
# paragraphs ruff leaves over 100 re-filled (tools/rewrap.py), then ruff format again (for the end
# comments it moved). Running it twice changes nothing the second time.
format: $(VENV)/.installed
	$(BIN)/ruff check --select I --fix --quiet .
	$(BIN)/ruff format .
	$(BIN)/python tools/rewrap.py .
	$(BIN)/ruff format .

# The documentation site (MkDocs, Material theme) into site/; broken links and anchors fail the build.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

$(VENV)/.installed-docs: $(VENV)/.installed
	$(BIN)/uv pip install --python $(BIN)/python --quiet -e '.[test,docs]' || \
	  $(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,docs]'
	$(SIGNALS_HELD)
	touch $@

clean:
	rm -rf $(VENV) $(CACHE) $(OUT) .pytest_cache site
