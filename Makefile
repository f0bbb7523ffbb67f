# Decision Index runner. `make run` and `make test` install what they need first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= ../shared/data
CACHE  ?= .dxi-cache
OUT    ?= out
MODEL  ?= embedded:sparrow-nano-general-v1.1
LLM    ?= qwen2.5-coder-0.5b
LLM_LIMIT ?= 10
LIMIT  ?=

.PHONY: install install-llm model run run-llm smoke score report test test-quick lint bench clean

install: $(VENV)/.installed

# uv installs in a few seconds what pip takes ~20 s for; pip alone is the fallback. Bytecode is compiled
# at install (as pip does), so that no run pays for it: dxi's start-up drops from ~1.8 s to ~1.0 s.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/pip install --quiet --disable-pip-version-check uv && \
	  $(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -e '.[test]' ) || \
	  $(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

# The optional extra for the local language model (xllamacpp, a 32 MB CPU wheel); `make run` does without.
install-llm: $(VENV)/.installed-llm

$(VENV)/.installed-llm: $(VENV)/.installed
	$(BIN)/uv pip install --python $(BIN)/python --quiet -e '.[test,local-llm]' || \
	  $(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,local-llm]'
	touch $@

# The local model's GGUF file, fetched once per machine into ~/.cache/decision-index/models (checked by sha256).
model: install
	$(BIN)/dxi fetch-model $(LLM)

# The local language model in both modes (structured outputs, logprob decisions) beside the embedded
# decision model, on the first LLM_LIMIT tasks of each evaluation (LLM_LIMIT= for the whole index: hours).
run-llm: install-llm model
	$(BIN)/dxi run --model $(MODEL) --model llamacpp:$(LLM) --model llamacpp-logprobs:$(LLM) \
	  --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)/llm $(if $(LLM_LIMIT),--limit $(LLM_LIMIT))

# The whole Decision Index on the embedded decision model (no key, no network).
run: install
	$(BIN)/dxi run --model $(MODEL) --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)

# Five tasks of each evaluation, for a quick check.
smoke: install
	$(BIN)/dxi run --model $(MODEL) --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT)/smoke --limit 5

# Rescore every model in the cache, without the network (LIMIT=N: the first N tasks of each evaluation,
# e.g. LIMIT=10 after `make run-llm`, whose models have only those).
score: install
	$(BIN)/dxi score --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT) $(if $(LIMIT),--limit $(LIMIT))

# Rescore and write the HTML report with CSV/Parquet tables (out/report.html, out/tables/); LIMIT as above.
report: install
	$(BIN)/dxi report --data-dir $(DATA) --cache-dir $(CACHE) --out $(OUT) $(if $(LIMIT),--limit $(LIMIT))

# Every test, the real local language model's included (installs the extra and fetches the model once).
test: install-llm model
	$(BIN)/pytest

# Every test but the local language model's (a faster loop while developing).
test-quick: install
	$(BIN)/pytest -m "not local_llm"

# Every benchmarks/bench_*.py, measured side by side; results in out/bench/.
bench: install
	$(BIN)/python -m benchmarks

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(CACHE) $(OUT) .pytest_cache
