# Every target works on a fresh clone: the virtualenv is created on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test lint bench eval clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/compaction-proxy serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check compaction config evaluation proxy tests
	$(BIN)/ruff format --check compaction config evaluation proxy tests
	$(BIN)/mypy

# Benchmarks against a direct connection and LiteLLM (installed once into
# .bench-venv/); writes tests/bench/RESULTS.md. BENCH_ARGS: --quick, --no-peer, --no-profile.
bench: $(STAMP)
	BENCH_COMMAND="make bench" $(BIN)/python -m tests.bench.run $(BENCH_ARGS)

# Scores what compaction keeps of every fixture at 8k/16k/32k for each
# strategy (extractive, offline); writes evaluation/RESULTS.md.
EVAL_FIXTURES ?= ../shared/fixtures
eval: $(STAMP)
	$(BIN)/compaction-proxy eval $(EVAL_FIXTURES) --output evaluation/RESULTS.md $(EVAL_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
