#!/usr/bin/env bash
# The full benchmark of docs/benchmarks.md: each workload with its own step count (gpt-tiny
# and mlp-large steps take a tenth of a second to seconds on one thread), 3 interleaved rounds;
# then one epoch of Fashion-MNIST against the PyTorch DDP script, then the collectives. The
# workloads' ddp2 modes also run under accelerate launch (scripts/accelerate_peer.py).
# Every run is on the project's interpreter (.venv, made by `make deps`), or $PYTHON.
set -euo pipefail
build=${1:-build}
out=$build/bench
python=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
if ! command -v "$python" >/dev/null; then
  echo "bench_all: error: no Python interpreter at $python; run \`make deps\` (scripts/install-deps.sh)" >&2
  exit 1
fi
"$python" scripts/bench.py --build "$build" --repeats 3 --workloads mlp-small --out "$out/mlp-small" --no-collectives
"$python" scripts/bench.py --build "$build" --repeats 3 --workloads gpt-tiny --steps 40 --out "$out/gpt-tiny" --no-collectives
"$python" scripts/bench.py --build "$build" --repeats 3 --workloads mlp-large --steps 20 --out "$out/mlp-large" --no-collectives
# Real data: one epoch of Fashion-MNIST, hasten DDP vs PyTorch DDP on 2 processes.
"$python" scripts/bench.py --build "$build" --repeats 3 --workloads --no-collectives --fashion-mnist \
    --fmnist-epochs 1 --out "$out/fashion-mnist"
# fsdp across two loopback machines: FULL_SHARD vs HSDP (HYBRID_SHARD over a 2 x 2 mesh).
"$python" scripts/bench.py --build "$build" --repeats 3 --workloads --no-collectives --no-data-workers --hsdp \
    --out "$out/hsdp"
# Tensor parallelism: the char LM (width 2048) under ddp on 2 processes vs split over tp 2.
"$python" scripts/bench.py --build "$build" --repeats 3 --workloads --no-collectives --no-data-workers --tp \
    --out "$out/tp"
# Big-model inference: the weights whole in memory vs a 100 MiB CPU budget and the rest on disk.
"$python" scripts/bench.py --build "$build" --repeats 3 --workloads --no-collectives --no-data-workers --big-model \
    --out "$out/big-model"
"$python" scripts/bench.py --build "$build" --workloads --modes --out "$out/collectives"
cat "$out/mlp-small/benchmarks.md" "$out/gpt-tiny/benchmarks.md" "$out/mlp-large/benchmarks.md" \
    "$out/fashion-mnist/benchmarks.md" "$out/hsdp/benchmarks.md" "$out/tp/benchmarks.md" "$out/big-model/benchmarks.md" \
    "$out/collectives/benchmarks.md" > "$out/benchmarks.md"
echo "written: $out/benchmarks.md"
