#!/usr/bin/env bash
# Installs the Debian 12 packages hasten needs to build, test and run; idempotent: it does
# nothing when every package is already present, and runs `apt-get update` only before a
# real install (a fresh machine has no package lists).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev python3-torch        # tensors/autograd/optim/TCPStore; the parity oracle
  libopenblas0-pthread              # fast float32 products (the reference BLAS is ~10x slower)
  libgloo-dev                       # CPU collectives (comm plugin gloo)
  libboost-dev libboost-filesystem-dev   # Boost.DLL
  libcli11-dev libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libdlpack-dev
  libgtest-dev libgmock-dev
  libprotobuf-dev protobuf-compiler # tensorboard tracker: event/summary messages from a .proto subset
  python3-protobuf                  # the integration tests' TensorBoard event-file reader
  binutils file jq procps
  zlib1g-dev                        # gzread for the Fashion-MNIST example's IDX files
  dataset-fashion-mnist             # the real data set of `make demo` and its tests
  fortunes                          # the char LM example's text corpus (/usr/share/games/fortunes)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "deps: error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get update -q; then
  echo "deps: error: apt-get update failed; cannot install ${missing[*]}" >&2; exit 1
fi
if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  echo "deps: error: apt-get install failed for: ${missing[*]}" >&2; exit 1
fi
echo "deps: installed ${#missing[@]} packages"
