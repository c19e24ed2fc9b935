#!/usr/bin/env bash
# The plain-C plugin examples installed with the SDK (share/hasten/examples/c-plugins), built
# as a third party would: against an installed hasten found through find_package(hasten
# COMPONENTS sdk) with only that prefix to search and LibTorch and spdlog made unfindable.
# Then: the package's components behave, `hasten plugins` accepts and describes both plugins,
# the tracker writes its lines in a training, and the comm plugin carries a two-process
# training to the losses the first-party shm backend gives, every collective of every dtype
# (three ranks, chunked) and a dead peer as an error.
# Usage: c_plugins.sh BUILD_DIR TORCH_TESTS (the hasten_rank_tests executable)
set -euo pipefail
build_dir=$1
torch_tests=$2
python=${HASTEN_TEST_PYTHON:-python3}  # the project's (ctest sets it); reads the JSON below
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
examples=$prefix/share/hasten/examples/c-plugins
test -f "$examples/CMakeLists.txt" || { echo "the C examples are not installed in $examples"; exit 1; }
# Nothing from the caller's environment may point at LibTorch or another hasten.
unset CMAKE_PREFIX_PATH Torch_DIR spdlog_DIR hasten_DIR
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
no_torch=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON -DCMAKE_DISABLE_FIND_PACKAGE_spdlog=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON)

# 1. The examples build with -Werror where LibTorch and spdlog cannot be found...
cmake -S "$examples" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${no_torch[@]}" \
      -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" "${launcher[@]}" >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; echo "the C examples do not configure without LibTorch"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# ...and where they can, the sdk component does not even look for them.
cmake -S "$examples" -B "$work/build_looking" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
for cache in "$work/build/CMakeCache.txt" "$work/build_looking/CMakeCache.txt"; do
  if grep -E '^(Torch|spdlog|fmt|Caffe2)_DIR' "$cache"; then echo "the sdk component looked for LibTorch or spdlog ($cache)"; exit 1; fi
done
tracker=$work/build/libhasten-tracker-c_lines.so
comm=$work/build/libhasten-comm-c_shm.so

# 2. Components: sdk alone has no hasten::hasten, the default has it, an unknown one fails.
probe=$work/probe
mkdir -p "$probe"
cat >"$probe/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.22)
project(probe LANGUAGES C CXX)
if(PROBE_COMPONENTS)
  find_package(hasten REQUIRED COMPONENTS ${PROBE_COMPONENTS})
else()
  find_package(hasten REQUIRED)
endif()
foreach(t hasten::sdk hasten::sdk_torch hasten::hasten)
  if(TARGET ${t})
    message(STATUS "probe: has ${t}")
  endif()
endforeach()
if(COMMAND hasten_add_plugin)
  message(STATUS "probe: has hasten_add_plugin")
endif()
EOF
probe() { cmake -S "$probe" -B "$work/probe_build_$1" -DCMAKE_PREFIX_PATH="$prefix" -DPROBE_COMPONENTS="$2" "${@:3}" 2>&1; }
out=$(probe sdk sdk "${no_torch[@]}") || { echo "$out"; exit 1; }
for want in "has hasten::sdk" "has hasten::sdk_torch" "has hasten_add_plugin"; do
  grep -q "probe: $want" <<<"$out" || { echo "COMPONENTS sdk: no '$want':"; echo "$out"; exit 1; }
done
if grep -q "probe: has hasten::hasten" <<<"$out"; then echo "COMPONENTS sdk loaded hasten::hasten"; exit 1; fi
out=$(probe default "") || { echo "$out"; exit 1; }
grep -q "probe: has hasten::hasten" <<<"$out" || { echo "no components: no hasten::hasten:"; echo "$out"; exit 1; }
# core needs LibTorch: made unfindable, the package is not found (instead of a broken target).
if out=$(probe core core "${no_torch[@]}"); then echo "COMPONENTS core was found without LibTorch"; exit 1; fi
if out=$(probe nope "sdk;nope"); then echo "an unknown component was accepted"; exit 1; fi
grep -q "hasten has no component 'nope' (it has: sdk, core)" <<<"$out" || { echo "$out"; exit 1; }
echo "package components: OK"

# 3. The host accepts both and prints their described options.
export HASTEN_HOME=$work/home
"$prefix/bin/hasten" plugins inspect "$tracker"
"$prefix/bin/hasten" plugins inspect "$comm"
described=$(HASTEN_PLUGIN_PATH=$work/build "$prefix/bin/hasten" plugins describe c_lines)
grep -q "digits" <<<"$described" || { echo "describe c_lines does not show its options:"; echo "$described"; exit 1; }
described=$(HASTEN_PLUGIN_PATH=$work/build "$prefix/bin/hasten" plugins describe c_shm)
grep -q "buffer_mb" <<<"$described" || { echo "describe c_shm does not show its options:"; echo "$described"; exit 1; }

# 4. The tracker in a training: one "<step> loss <value>" line per logged loss, in the file its
# option names, with the digits asked for; append keeps the first run's lines.
lines=$work/lines.txt
cat >"$work/tracker.yaml" <<EOF
trackers: [$tracker]
tracker_options: {c_lines: {path: $lines, digits: 9}}
logging_dir: $work/logs
EOF
train() { "$prefix/bin/hasten-example" --workload mlp-small --warmup 0 --log-every 1 "$@"; }
train --steps 4 --config_file "$work/tracker.yaml" >/dev/null
"$python" - "$lines" 4 <<'PY'
import re, sys
path, want = sys.argv[1], int(sys.argv[2])
rows = open(path).read().splitlines()
loss = [r for r in rows if re.fullmatch(r"\d+ loss -?[0-9.e+-]+", r)]
if len(loss) != want or len(rows) < want:
    sys.exit(f"c_lines wrote {len(loss)} loss lines of {len(rows)}, expected {want}:\n" + "\n".join(rows))
if [int(r.split()[0]) for r in loss] != sorted(int(r.split()[0]) for r in loss):
    sys.exit("c_lines: steps out of order:\n" + "\n".join(rows))
if not any(len(r.split()[2].replace(".", "").replace("-", "").split("e")[0].lstrip("0")) > 6 for r in loss):
    sys.exit("c_lines: digits 9 was not used:\n" + "\n".join(rows))
PY
train --steps 2 --config_file "$work/tracker.yaml" --set "tracker_options={c_lines: {path: $lines, digits: 9, append: true}}" \
  >/dev/null
test "$(grep -c ' loss ' "$lines")" = 6 || { echo "append: expected 6 loss lines"; cat "$lines"; exit 1; }
# An option out of its described range is refused before create, naming it.
if out=$(train --steps 1 --config_file "$work/tracker.yaml" --set "tracker_options={c_lines: {digits: 40}}" 2>&1); then
  echo "digits 40 was accepted"; exit 1
fi
grep -q "c_lines options: digits: 40 is out of range (allowed: 1 to 17)" <<<"$out" \
  || { echo "the refusal does not name digits: $out"; exit 1; }
# A failure of the plugin's own reaches the user with its message, once, and training goes on
# (a failing tracker is dropped, docs/trackers.md).
if ! out=$(train --steps 3 --config_file "$work/tracker.yaml" --set "tracker_options={c_lines: {path: $work/no/such/dir/x}}" 2>&1); then
  echo "an unwritable tracker path ended the training: $out"; exit 1
fi
grep -q "start failed (system error): c_lines: cannot open $work/no/such/dir/x: No such file or directory" <<<"$out" \
  || { echo "the failure to open is not reported: $out"; exit 1; }
test "$(echo "$out" | grep -c "c_lines: cannot open")" = 1 || { echo "the failure is not reported once: $out"; exit 1; }
echo "c_lines tracker: OK"

# 5. The comm plugin carries a two-process training (selected by path, small buffers so that
# every collective goes in chunks) to the losses of the first-party shm backend.
launch() { "$prefix/bin/hasten" launch --num_processes 2 --main_process_port 0 "$prefix/bin/hasten-example" \
             --workload mlp-small --steps 3 --warmup 0 "$@"; }
launch --set comm=shm --losses-out "$work/shm.json" >"$work/shm.log" 2>&1 || { cat "$work/shm.log"; exit 1; }
printf 'comm: %s\ncomm_options: {buffer_mb: 0.001}\n' "$comm" >"$work/comm.yaml"
launch --config_file "$work/comm.yaml" --losses-out "$work/c_shm.json" >"$work/c_shm.log" 2>&1 \
  || { cat "$work/c_shm.log"; exit 1; }
grep -q "c_shm: connected every rank through shared memory" "$work/c_shm.log" \
  || { echo "c_shm did not carry the run:"; cat "$work/c_shm.log"; exit 1; }
"$python" - "$work/shm.json" "$work/c_shm.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["losses"] for p in sys.argv[1:3])
if len(a) != 3 or a != b:
    sys.exit(f"c_shm losses differ from shm's: {a} vs {b}")
print(f"c_shm comm: a two-process training gives shm's losses exactly: {b}")
PY

# 6. Every collective and dtype on three ranks, and a dead peer, through the public API.
HASTEN_TEST_C_PLUGIN_DIR=$work/build "$torch_tests" --gtest_filter='CExampleComm.*' \
  >"$work/gtest.log" 2>&1 || { cat "$work/gtest.log"; exit 1; }
grep -q "\[  PASSED  \] 2 tests" "$work/gtest.log" || { cat "$work/gtest.log"; echo "the CExampleComm tests did not run"; exit 1; }
echo "c_shm comm: every operation and dtype on three ranks, dead peer: OK"
echo "plain-C plugins: OK"
