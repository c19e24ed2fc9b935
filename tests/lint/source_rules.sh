#!/usr/bin/env bash
# Rules of the source tree that a grep can check (ctest lint.source_rules):
#  1. LibTorch version branches live in sdk/include/hasten/torch_compat.hpp alone: no other
#     file tests TORCH_VERSION_MAJOR/MINOR/PATCH (TORCH_VERSION as a string, for reports, is fine).
#  2. Tests and scripts run the project's Python (.venv, HASTEN_TEST_PYTHON), whose torch is the
#     LibTorch hasten builds against: never Debian's /usr/bin/python3.
set -euo pipefail
root=${1:?usage: source_rules.sh SOURCE_DIR}
cd "$root"
status=0
branches=$(grep -rnE 'TORCH_VERSION_(MAJOR|MINOR|PATCH)' --include='*.h' --include='*.hpp' --include='*.cpp' \
             --include='*.c' core sdk plugins apps tests | grep -v '^sdk/include/hasten/torch_compat.hpp:' || true)
if [ -n "$branches" ]; then
  echo "LibTorch version branches outside sdk/include/hasten/torch_compat.hpp:"
  echo "$branches"
  status=1
fi
pythons=$(grep -rn '/usr/bin/python3' tests scripts Makefile | grep -v '^tests/lint/' || true)
if [ -n "$pythons" ]; then
  echo "/usr/bin/python3 in tests or scripts (use the project's .venv interpreter):"
  echo "$pythons"
  status=1
fi
[ "$status" -eq 0 ] && echo "source rules hold"
exit "$status"
