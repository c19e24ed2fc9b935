#!/usr/bin/env bash
# The longer fuzz run (`make fuzz`, not part of `make test`): the config, safetensors, checkpoint and plugin file fuzz
# tests of the unit suites, from SEED, each for SECONDS. A failure prints the case and its
# input; rerun with the same seed to reproduce it.
#   scripts/fuzz.sh BUILD_DIR [SEED] [SECONDS]
set -euo pipefail
build=${1:-build}
seed=${2:-$(date +%s)}
seconds=${3:-120}
case "$seed$seconds" in *[!0-9.]*) echo "fuzz: error: SEED must be an integer and SECONDS a number, got '$seed' '$seconds'" >&2; exit 2 ;; esac
echo "fuzz: seed $seed, $seconds s per target"
export HASTEN_TEST_FUZZ_SEED=$seed HASTEN_TEST_FUZZ_SECONDS=$seconds
export HASTEN_HOME=$(mktemp -d)
trap 'rm -rf "$HASTEN_HOME"' EXIT
"$build/bin/hasten_core_tests" --gtest_filter='ConfigFuzz.*'
"$build/bin/hasten_torch_tests" --gtest_filter='SafetensorsFuzz.*:CheckpointFuzz.*'
# The project's interpreter (.venv, made by `make deps`), as ctest runs the integration tests.
python=${HASTEN_TEST_PYTHON:-$(dirname "$0")/../.venv/bin/python}
HASTEN_TEST_BIN_DIR="$build/bin" HASTEN_TEST_PEER_DIR="$(dirname "$0")/../tests/integration/peers" \
  HASTEN_TEST_PYTHON="$python" "$python" "$(dirname "$0")/../tests/integration/test_plugin_fuzz.py"
