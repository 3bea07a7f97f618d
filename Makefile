# fastlight: `make train` and `make test` work on a fresh machine (they create .venv).
PYTHON ?= python3
VENV   ?= .venv
# Pinned here so a CPU machine gets the CPU wheel; override with e.g. `make TORCH=torch==2.6.0 test`.
TORCH  ?= torch==2.13.0
CONFIG ?= configs/highway_dpsa.yaml
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fastlight-installed
export MUJOCO_GL ?= egl

.PHONY: install train test test-numeric test-multinode test-ranks test-slow test-all bench gpu-check lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

train: install
	$(BIN)/fastlight fit --config $(CONFIG)

test: install
	$(BIN)/python -m pytest -q --durations=30 -m "not slow and not benchmark and not gpu and not multinode and not ranks"

# The numeric tests (losses, advantages, models, modules) under every CPU kernel family PyTorch can
# pick: `default` (no SIMD), `avx2`, and the machine's own. A test that only passes on one of them
# compares floats bitwise where the kernels differ.
NUMERIC := tests/losses tests/test_advantages.py tests/test_rollout.py tests/models tests/modules tests/vla
test-numeric: install
	for cap in default avx2; do \
	  echo "== ATEN_CPU_CAPABILITY=$$cap"; \
	  ATEN_CPU_CAPABILITY=$$cap $(BIN)/python -m pytest -q -p no:cacheprovider \
	    -m "not slow and not benchmark and not gpu and not multiproc" $(NUMERIC) || exit 1; \
	done

# Two "nodes" on localhost, two process trees each in its own session: torchrun and Lightning's
# environment launch (tests/multinode; about 2 CPU-minutes, so apart from `make test`); and a three-node
# Ray cluster started with `ray start` that loses a node to SIGKILL (about 2 more minutes, wall time).
test-multinode: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m multinode tests/multinode

# Two trainer ranks on this machine (DDP, a stop signal in one rank, a lost rank, a lost FSDP2 rank and the
# resume from its sharded checkpoint): about 3 CPU-minutes,
# apart from `make test` like the two nodes, and in .ci/run.
test-ranks: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "ranks and not slow and not benchmark and not gpu"

test-slow: install
	$(BIN)/python -m pytest -q -m "slow"

test-all: install
	$(BIN)/python -m pytest -q -m "not gpu"

bench: install
	$(BIN)/python -m pip install -q -e ".[bench]"
	$(BIN)/python -m benchmarks.sampling
	$(BIN)/python -m benchmarks.pruning
	$(BIN)/python -m benchmarks.sync

# On a CUDA machine: pytest -m gpu, a bf16 VLA update, the CUDA inference worker end to end and the
# same-GPU weight sync of a 1B-parameter model (CUDA IPC vs gloo), a few minutes in all; writes
# benchmarks/results/gpu.md. Without a CUDA device it says so and exits 2.
gpu-check: install
	$(BIN)/python -m benchmarks.gpu_check

lint: install
	$(BIN)/ruff check fastlight benchmarks tests examples

clean:
	rm -rf runs lightning_logs .pytest_cache
