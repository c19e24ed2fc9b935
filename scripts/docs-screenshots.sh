#!/usr/bin/env bash
# The pictures of docs/trackers.md, from a real run: hasten-fashion-mnist trains two epochs with
# the tensorboard tracker (scalars, the --log_samples strip of test images and the table of
# guesses) and the profiler on; TensorBoard from .venv-services serves the run and headless
# Chromium photographs its scalars, images and text tabs; scripts/trace_timeline.py draws one
# profiled step of rank 0's Chrome trace. Not part of any test (pictures are not checked);
# installs Chromium where it is missing. Usage: scripts/docs-screenshots.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
out="$root/docs/img"
bash "$root/scripts/install-deps.sh"
if ! command -v chromium >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
fi
cmake --build "$build" --target hasten_demo >/dev/null
work="$(mktemp -d)"
tb_pid=""
cleanup() {
  [ -n "$tb_pid" ] && kill "$tb_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "docs-screenshots: training (2 epochs, tensorboard tracker, profiler over steps 20-21)"
"$build/bin/hasten-fashion-mnist" --epochs 2 --batch_size 256 --threads 2 --log_every 10 --log_samples 12 \
  --log_with tensorboard --project_dir "$work/run" --quiet \
  --set profile.wait=19 --set profile.warmup=1 --set profile.active=2 --set "profile.dir=$work/profile"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$root/.venv-services/bin/tensorboard" --logdir "$work/run/hasten_logs" --host 127.0.0.1 --port "$port" \
  >"$work/tensorboard.log" 2>&1 &
tb_pid=$!
for _ in $(seq 1 60); do
  curl -fs "http://127.0.0.1:$port/data/runs" >/dev/null 2>&1 && break
  sleep 1
done
curl -fs "http://127.0.0.1:$port/data/runs" >/dev/null || { cat "$work/tensorboard.log"; exit 1; }

mkdir -p "$out"
shot() {  # name, URL fragment
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,900 \
    --virtual-time-budget=20000 --user-data-dir="$work/chromium" --screenshot="$out/$1.png" \
    "http://127.0.0.1:$port/$2" >/dev/null 2>&1
  echo "docs-screenshots: $out/$1.png"
}
shot tensorboard-scalars "#scalars&tagFilter=loss|accuracy"
shot tensorboard-images "#images"
shot tensorboard-text "#text"
trace=$(ls "$work"/profile/*rank0*.pt.trace.json | head -1)
"$root/.venv/bin/python" "$root/scripts/trace_timeline.py" "$trace" "$out/profile-step.png"
