#!/usr/bin/env bash
# Installs hasten to a temporary prefix, checks that its headers expose no internals
# (installed_headers.py), builds two plugins against it out of tree (a tracker
# in plain C, a strategy in C++), checks that `hasten plugins inspect` accepts both, and
# trains with them through the installed hasten-example.
set -euo pipefail
build_dir=$1
source_dir=$2
python=${HASTEN_TEST_PYTHON:-python3}  # the project's (ctest sets it); reads the JSON below
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
# What was installed is for users and plugin authors: no internal header or type of core/src.
"$python" "$source_dir/tests/abi/installed_headers.py" "$prefix" "$source_dir"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
cmake -S "$source_dir/tests/abi/out_of_tree" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" >/dev/null
cmake --build "$work/build" >/dev/null
tracker=$work/build/libhasten-tracker-oot_c.so
strategy=$work/build/libhasten-strategy-oot_cpp.so
"$prefix/bin/hasten" plugins inspect "$tracker"
"$prefix/bin/hasten" plugins inspect "$strategy"
# The installed plugin directory is found from the installed library.
grep -q "$prefix/lib/hasten/plugins/libhasten-tracker-csv.so" <<<"$("$prefix/bin/hasten" plugins)"
export HASTEN_HOME=$work/home
# The strategy owns the config section oot_config and answers to distributed_type
# OOT_COUNTING: a config file selects and sets it without a word about it in the core.
strategy_dir=$work/strategy_plugins
mkdir -p "$strategy_dir" && cp "$strategy" "$strategy_dir/"
export HASTEN_PLUGIN_PATH=$strategy_dir
grep -q "selected by distributed_type: OOT_COUNTING" <<<"$("$prefix/bin/hasten" plugins describe oot_cpp)"
printf 'distributed_type: OOT_COUNTING\noot_config:\n  count_file: %s\n' "$work/steps.txt" > "$work/oot.yaml"
"$prefix/bin/hasten-example" --workload mlp-small --steps 6 --warmup 0 --log-every 1 \
  --config_file "$work/oot.yaml" --trackers "$tracker" --set "logging_dir=$work/logs"
test "$(cat "$work/steps.txt")" = "6" || { echo "strategy counted $(cat "$work/steps.txt") steps, expected 6"; exit 1; }
# A misspelt key of its section is named, with the plugin's own key as the near match.
if out=$("$prefix/bin/hasten-example" --workload mlp-small --steps 1 --set distributed_type=OOT_COUNTING \
           --set oot_config.count_fille=x 2>&1); then echo "a misspelt oot_config key was accepted"; exit 1; fi
grep -q "did you mean 'oot_config.count_file'" <<<"$out" || { echo "no near match: $out"; exit 1; }
unset HASTEN_PLUGIN_PATH
lines=$(grep -c " loss=" "$work/logs/hasten-example/oot_tracker.log")
test "$lines" = "6" || { echo "tracker logged $lines losses, expected 6"; exit 1; }
# A comm plugin the core selects from its own declaration (serves CPU, priority 1000 above
# every first-party backend): no name in the config, only its directory on the plugin path.
store_comm=$work/build/libhasten-comm-oot_store.so
"$prefix/bin/hasten" plugins inspect "$store_comm"
comm_dir=$work/comm_plugins
mkdir -p "$comm_dir" && cp "$store_comm" "$comm_dir/"
"$prefix/bin/hasten" launch --num_processes 2 --main_process_port 0 "$prefix/bin/hasten-example" --workload mlp-small \
  --steps 3 --warmup 0 --losses-out "$work/default.json" >/dev/null 2>&1
HASTEN_PLUGIN_PATH=$comm_dir "$prefix/bin/hasten" launch --num_processes 2 --main_process_port 0 \
  "$prefix/bin/hasten-example" --workload mlp-small --steps 3 --warmup 0 --losses-out "$work/store.json" \
  >"$work/store.log" 2>&1 || { cat "$work/store.log"; exit 1; }
grep -q "oot_store comm: rank 0 of 2 connected" "$work/store.log" || { echo "the core did not pick oot_store:"; cat "$work/store.log"; exit 1; }
"$python" - "$work/default.json" "$work/store.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
a, b = (x["losses"] if isinstance(x, dict) else x for x in (a, b))
d = max(abs(x - y) for x, y in zip(a, b))
if len(a) != 3 or len(a) != len(b) or d > 1e-5:
    sys.exit(f"oot_store losses differ from the default backend's: {a} vs {b}")
print(f"oot_store comm: picked by the core, losses match the default backend (max diff {d:.2e})")
PY
echo "out-of-tree plugins: OK"
