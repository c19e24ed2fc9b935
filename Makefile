# The two README commands (`make demo`, `make test`) and their helpers. Every target that
# needs the toolchain first runs the idempotent dependency script.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
BUILD_TYPE ?= Release
# The compilers hasten is built with: Clang 19 (scripts/install-deps.sh installs it), whose
# LibTorch precompiled header costs a translation unit ~2 s where GCC's costs ~5.5 s (GCC redoes
# the header's pending template instantiations in every unit): the rebuild after an edit of
# accelerator.hpp takes 42 s (docs/architecture.md, "Build time"; GCC took 113 s on the layout
# before the last build changes, Clang 59 s). GCC 12 builds it too: `make build HASTEN_CC=gcc
# HASTEN_CXX=g++ BUILD_DIR=build-gcc`.
HASTEN_CC ?= clang-19
HASTEN_CXX ?= clang++-19
CTEST_ARGS ?=
# The project's interpreter (scripts/install-deps.sh makes .venv: torch, accelerate, ...); the
# bench scripts and their PyTorch and accelerate peers run on it, never on the system's python3.
PYTHON ?= .venv/bin/python

.PHONY: all deps configure build build-demo test test-fast test-slow test-cluster fuzz demo bench install clean

all: build

deps:
	@bash scripts/install-deps.sh

# A build folder keeps the compilers it was first configured with (naming others would make CMake
# delete its cache); a new BUILD_DIR takes HASTEN_CC/HASTEN_CXX.
configure: deps
	@if [ -f $(BUILD_DIR)/CMakeCache.txt ]; then \
	  if [ "$(origin HASTEN_CXX)" = "command line" ] || [ "$(origin HASTEN_CC)" = "command line" ]; then \
	    echo "make: $(BUILD_DIR) keeps the compilers it was configured with; HASTEN_CC/HASTEN_CXX apply to a new BUILD_DIR" >&2; fi; \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null; \
	else \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	    -DCMAKE_C_COMPILER=$(HASTEN_CC) -DCMAKE_CXX_COMPILER=$(HASTEN_CXX) >/dev/null; \
	fi

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Only what `make demo` runs: the CLI, the Fashion-MNIST example and the plugins (no tests).
build-demo: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target hasten_demo

# Tests labelled slow (the parity tests under every CPU kernel family, MKL or OpenBLAS) and cluster
# (a real one-node SLURM) are left out; `make test-slow` and `make test-cluster` run them.
test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE '^(slow|cluster)$$' $(CTEST_ARGS)

# The unit tests and the quick integration tests (ctest labels unit and quick): a few minutes
# after a build, for the edit-build-test loop; `make test` stays what CI runs.
test-fast: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -L '^(unit|quick)$$' $(CTEST_ARGS)

test-slow: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L '^slow$$' $(CTEST_ARGS)

# A real one-node SLURM cluster on loopback (tests/integration/test_slurm.py installs slurm-wlm
# and munge, starts munged, slurmctld and slurmd, and stops them).
test-cluster: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L '^cluster$$' $(CTEST_ARGS)

# Not part of `make test`: the config and safetensors fuzz tests from FUZZ_SEED (default: the
# time) for FUZZ_SECONDS each (default 120). `make fuzz FUZZ_SEED=7 FUZZ_SECONDS=600`.
fuzz: build
	@bash scripts/fuzz.sh $(BUILD_DIR) $(FUZZ_SEED) $(FUZZ_SECONDS)

demo: build-demo
	@bash scripts/demo.sh $(BUILD_DIR)

# Not part of `make test` (no timing in tests): hasten vs the plain LibTorch loop vs PyTorch
# (and, in the ddp2 modes, PyTorch's loop under accelerate launch), the table of
# docs/benchmarks.md. `make bench BENCH_ARGS="--workloads mlp-small --repeats 1"` runs a part
# of it; `BENCH_ARGS="--workloads --no-collectives --fashion-mnist --fmnist-max-steps 200
# --repeats 1"` a short Fashion-MNIST row (hasten DDP vs PyTorch DDP on 2 processes).
bench: build
	@if [ -n "$(BENCH_ARGS)" ]; then $(PYTHON) scripts/bench.py --build $(BUILD_DIR) $(BENCH_ARGS); \
	 else PYTHON=$(PYTHON) bash scripts/bench_all.sh $(BUILD_DIR); fi

install: build
	@cmake --install $(BUILD_DIR) --prefix $(or $(PREFIX),/usr/local)

clean:
	rm -rf $(BUILD_DIR)
