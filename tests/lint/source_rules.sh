#!/usr/bin/env bash
# Rules of the source tree that a grep can check (ctest lint.source_rules):
#  1. LibTorch version branches live in sdk/include/hasten/torch_compat.hpp alone: no other
#     file tests TORCH_VERSION_MAJOR/MINOR/PATCH (TORCH_VERSION as a string, for reports, is fine).
#  2. Tests and scripts run the project's Python (.venv, HASTEN_TEST_PYTHON), whose torch is the
#     LibTorch hasten builds against: never Debian's /usr/bin/python3.
#  3. No file under core/ is over 500 lines (a file that grows past it is two jobs).
#  4. The core only routes: no first-party comm plugin's name and no strategy plugin's option key
#     appears in core code as a string (comments aside): plugins own their vocabulary.
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
long=$(find core -name '*.cpp' -o -name '*.hpp' -o -name '*.h' | sort | xargs wc -l | awk '$2 != "total" && $1 > 500')
if [ -n "$long" ]; then
  echo "files under core/ over 500 lines (split them by job):"
  echo "$long"
  status=1
fi
comm_names=$(ls -d plugins/comm/*/ | xargs -n1 basename | grep -v '^common$')
option_keys=$(grep -rhoE 'OptionSpec\("[a-z_0-9]+"|\{ *"[a-z_0-9]+", *HASTEN_OPTION_' plugins/strategy | grep -oE '"[a-z_0-9]+"' | tr -d '"' | sort -u)
[ -n "$option_keys" ] || { echo "found no strategy option keys in plugins/strategy (the rule's pattern is stale)"; status=1; }
# "version": the sharded plugin's fsdp version, and also a field of the core's own file formats.
option_keys=$(echo "$option_keys" | grep -vx 'version')
for word in $comm_names $option_keys; do
  hits=$(grep -rn --include='*.cpp' --include='*.hpp' "\"$word\"" core | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
  if [ -n "$hits" ]; then
    echo "the plugin word \"$word\" in core code (the plugin owns it; the core routes):"
    echo "$hits"
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "source rules hold"
exit "$status"
