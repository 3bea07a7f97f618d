# fastlight: `make train` and `make test` work on a fresh machine (they create .venv).
PYTHON ?= python3
VENV   ?= .venv
# Pinned here so a CPU machine gets the CPU wheel; override with e.g. `make TORCH=torch==2.6.0 test`.
TORCH  ?= torch==2.13.0
CONFIG ?= configs/highway_dpsa.yaml
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.fastlight-installed
export MUJOCO_GL ?= egl

.PHONY: install train test test-numeric test-multinode test-slow test-all bench lint clean

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
	$(BIN)/python -m pytest -q --durations=30 -m "not slow and not benchmark and not gpu and not multinode"

# The numeric tests (losses, advantages, models, modules) under every CPU kernel family PyTorch can
# pick: `default` (no SIMD), `avx2`, and the machine's own. A test that only passes on one of them
# compares floats bitwise where the kernels differ.
NUMERIC := tests/losses tests/test_advantages.py tests/test_rollout.py tests/models tests/modules
test-numeric: install
	for cap in default avx2; do \
	  echo "== ATEN_CPU_CAPABILITY=$$cap"; \
	  ATEN_CPU_CAPABILITY=$$cap $(BIN)/python -m pytest -q -p no:cacheprovider \
	    -m "not slow and not benchmark and not gpu and not multiproc" $(NUMERIC) || exit 1; \
	done

# Two "nodes" on localhost, two process trees each in its own session: torchrun and Lightning's
# environment launch (tests/multinode; about 2 CPU-minutes, so apart from `make test`).
test-multinode: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m multinode tests/multinode

test-slow: install
	$(BIN)/python -m pytest -q -m "slow"

test-all: install
	$(BIN)/python -m pytest -q -m "not gpu"

bench: install
	$(BIN)/python -m pip install -q -e ".[bench]"
	$(BIN)/python -m benchmarks.sampling
	$(BIN)/python -m benchmarks.pruning
	$(BIN)/python -m benchmarks.sync

lint: install
	$(BIN)/ruff check fastlight benchmarks tests examples

clean:
	rm -rf runs lightning_logs .pytest_cache
