#!/usr/bin/env bash
# Installs what hasten needs to build, test and run; idempotent: it does nothing when
# everything is already present.
#
# 1. Debian 12 packages (the toolchain and the C/C++ libraries); `apt-get update` runs only
#    before a real install (a fresh machine has no package lists).
# 2. The project's Python environment `.venv`: LibTorch comes from PyTorch's PyPI wheel (the CUDA
#    build, which also runs on machines without a GPU), pinned with everything the tests and
#    peers need in scripts/venv-requirements.txt. The environment lives in a cache shared by
#    clones, keyed by the pins and the interpreter, and `.venv` links to it, so a fresh clone
#    (CI's) does not download ~3 GB again. HASTEN_VENV_CACHE moves the cache;
#    HASTEN_BASE_PYTHON picks the interpreter the environment is made from (default: python3).
# 3. `.venv-services`: the real services and readers the tests use beside hasten (MLflow's
#    tracking server and client, TensorBoard's PyTorch profiler plugin), pinned in
#    scripts/services-requirements.txt, cached and linked the same way, apart from .venv so that
#    their pins never move LibTorch's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

packages=(
  build-essential cmake ninja-build ccache pkg-config
  clang-19 lld-19                   # the compiler `make` builds with (Makefile: HASTEN_CXX) and its linker
  python3 python3-venv              # the interpreter .venv is made from
  libgloo-dev                       # CPU collectives (comm plugin gloo; plugins/comm/gloo/gloo_loader.c)
  openmpi-bin libopenmpi-dev        # mpirun (tests start runs with it) and the mpi comm plugin
  libboost-dev libboost-filesystem-dev   # Boost.DLL
  libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libdlpack-dev
  libgtest-dev libgmock-dev
  libprotobuf-dev protobuf-compiler # tensorboard tracker: event/summary messages from a .proto subset
  libpng-dev                        # tensorboard tracker: images as PNG
  binutils file jq procps
  libcurl4-openssl-dev              # mlflow tracker: the tracking server's REST API over HTTP(S)
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
else
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
fi

# --- the Python environments -------------------------------------------------------------
python="${HASTEN_BASE_PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "deps: error: no Python interpreter '$python' (set HASTEN_BASE_PYTHON)" >&2; exit 1
fi
pyver="$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
cache="${HASTEN_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hasten/venvs}"
mkdir -p "$cache"

# make_venv REQUIREMENTS PREFIX LINK [CHECK]: the environment of REQUIREMENTS' pins in the cache
# (shared by clones, keyed by the pins and the interpreter), made once; CHECK, a Python
# script run by it, must pass before it is declared complete. LINK (in the tree) points at it,
# unless LINK is a user's own environment, which is left alone. Sets $venv.
make_venv() {
  local requirements=$1 prefix=$2 link=$3 check=${4:-}
  local key
  key="$( { cat "$requirements"; echo "python=$pyver"; } | sha256sum | cut -c1-16)"
  venv="$cache/$prefix$key"
  # One installer at a time per cache (two clones set up at once share it).
  exec 9>"$cache/.lock"
  flock 9
  if [ ! -f "$venv/.hasten-complete" ]; then
    echo "deps: making the Python environment $venv (python $pyver, pins ${requirements#"$root"/})"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"; then
      rm -rf "$venv"
      echo "deps: error: pip could not install ${requirements#"$root"/}" >&2; exit 1
    fi
    if [ -n "$check" ] && ! "$venv/bin/python" -c "$check"; then rm -rf "$venv"; exit 1; fi
    touch "$venv/.hasten-complete"
  fi
  flock -u 9
  if [ -L "$root/$link" ] || [ ! -e "$root/$link" ]; then
    ln -sfn "$venv" "$root/$link"
  fi
}

# .venv: LibTorch from PyTorch's wheel and what the tests and peers need. The check: the wheel
# can build C++ (the CPU-only wheels of some releases ship no c10/ headers).
make_venv "$root/scripts/venv-requirements.txt" "" .venv '
import os, sys, torch
inc = os.path.join(os.path.dirname(torch.__file__), "include")
for h in ("c10/core/Device.h", "torch/csrc/api/include/torch/torch.h"):
    if not os.path.exists(os.path.join(inc, h)):
        sys.exit("deps: error: torch %s ships no %s: it cannot build C++" % (torch.__version__, h))
'
echo "deps: .venv -> $(readlink -f "$root/.venv") (torch $("$root/.venv/bin/python" -c 'import torch; print(torch.__version__)'))"

# .venv-services: MLflow's tracking server and client, TensorBoard's profiler plugin.
make_venv "$root/scripts/services-requirements.txt" services- .venv-services 'import mlflow, torch_tb_profiler'
echo "deps: .venv-services -> $(readlink -f "$root/.venv-services") (mlflow $("$root/.venv-services/bin/python" -c 'import mlflow; print(mlflow.__version__)'))"

# The CUDA wheel's CMake package needs the CUDA toolkit (nvcc) of its CUDA major version to
# configure against, even for a CPU-only hasten: checked here so that the first `make` does not
# stop inside LibTorch's CMake files. CUDAToolkit_ROOT names another toolkit.
cuda_major="$("$root/.venv/bin/python" -c 'import torch; print((torch.version.cuda or "").split(".")[0])')"
if [ -n "$cuda_major" ]; then
  nvcc=""
  for candidate in "${CUDAToolkit_ROOT:+$CUDAToolkit_ROOT/bin/nvcc}" "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then nvcc="$candidate"; break; fi
  done
  have=""
  if [ -n "$nvcc" ]; then have="$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -n1)"; fi
  if [ -z "$have" ] || [ "$have" -lt "$cuda_major" ]; then
    echo "deps: error: the pinned torch is a CUDA $cuda_major build, whose CMake package needs a CUDA $cuda_major toolkit (nvcc) to configure; found ${nvcc:-none}${have:+ (CUDA $have)}: install NVIDIA's cuda-toolkit-$cuda_major-x, or set CUDAToolkit_ROOT to one" >&2
    exit 1
  fi
  echo "deps: CUDA toolkit $have ($nvcc) for the CUDA $cuda_major wheel"
fi
