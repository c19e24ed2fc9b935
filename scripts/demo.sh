#!/usr/bin/env bash
# `make demo`: a real training run of the example program on an embedded default workload:
# two processes, data parallel (ddp over the gloo comm plugin), started by `hasten launch`,
# with the csv tracker writing demo_logs/hasten-demo/metrics.csv.
set -euo pipefail
build_dir=${1:-build}
export HASTEN_HOME=${HASTEN_HOME:-$PWD/$build_dir/demo_home}   # ignore any personal default config
"$build_dir/bin/hasten" launch --num_processes 2 --strategy ddp \
  "$build_dir/bin/hasten-example" --workload mlp-small --steps 300 --warmup 10 --log-every 50 \
  --trackers csv --project hasten-demo --set logging_dir=demo_logs
echo "metrics: demo_logs/hasten-demo/metrics.csv ($(($(wc -l < demo_logs/hasten-demo/metrics.csv) - 1)) rows)"
