#!/usr/bin/env bash
# One prepared check of hasten on a machine with NVIDIA GPUs and its own PyTorch (docs/gpu.md).
#
#   scripts/gpu-check.sh --prepare [--build-dir build]
#       On the build machine, after `make build`: assembles .gpu-carry/ (git-ignored), what a
#       GPU machine may lack, under ~60 MiB: the Fashion-MNIST .gz files, the fortunes corpus,
#       and a small sysroot of the third-party headers, libraries, CMake package files and
#       protoc the build uses outside LibTorch and the C/C++ standard libraries (the headers
#       exactly those the build's objects read, from `ninja -t deps`; the libraries those its
#       targets link and its CMake packages name, with what they load). Prints the carry's
#       size, the carry list and the command for the device tool.
#
#   scripts/gpu-check.sh [--python PY] [--build-dir DIR] [--minutes N] [--out DIR] [--all-targets]
#       On the GPU machine (default mode), within N minutes (default 8) in all:
#         a. machine: nvidia-smi -L, torch version, CUDA, GPU count; no CUDA or no GPU: one
#            line, exit 1
#         b. build prerequisites: cmake >= 3.22, ninja, g++ >= 12, nvcc, the third-party
#            headers, protoc, PY's numpy/safetensors/tensorboard/accelerate; .gpu-carry/sysroot
#            is used when it is there; anything missing: one line naming it, exit 2
#         c. configure (-DHASTEN_PYTHON=PY -DHASTEN_CUDA=ON, Release) in DIR (default
#            build-gpu) and build with -j$(nproc): the gpu tests, the CLI, the examples and
#            the plugins (--all-targets: everything)
#         d. ctest -L gpu --output-on-failure: a skipped test fails the check, except one that
#            needs more GPUs than the machine has (named in the summary)
#         e. hasten-fashion-mnist on the GPU, 5 epochs of batch 64 (GPU_CHECK_FMNIST_EPOCHS),
#            --trackers tensorboard csv: test accuracy >= 0.90
#         f. hasten-char-lm on the GPU, 300 optimizer steps (GPU_CHECK_CHARLM_STEPS),
#            --save_model: validation loss below the unigram entropy
#         g. PY's tensorboard reads the event files (EventAccumulator: the scalars are there
#            and agree with what the programs printed); safetensors.torch.load_file reads the
#            saved weights (names, shapes, finite values, the parameter count)
#         h. samples/s of hasten-example --workload gpt-tiny and mlp-large beside `accelerate
#            launch` of the same PyTorch loop (scripts/accelerate_peer.py --device cuda), one
#            process on one GPU each
#       Each step prints a PASS/FAIL line and runs under `timeout` within the deadline; the
#       last lines are a summary, and the exit status is 1 when any step failed. Logs and
#       results go to --out (default DIR/gpu-check); the training runs to DIR/gpu-check-runs.
#
# Device tool (after --prepare here): run(command="scripts/gpu-check.sh --out \"$OUT\"",
# carry=[".gpu-carry"], timeout_s=600).
set -uo pipefail

me=gpu-check
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
carry_dir=.gpu-carry
carry_limit_bytes=$((60 * 1024 * 1024))
fmnist_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
fmnist_system=/usr/share/datasets/fashion-mnist
fortunes_system=/usr/share/games/fortunes
# The headers hasten's own sources include from each third-party package (the probe of b.).
probe_headers=(yaml-cpp/yaml.h nlohmann/json.hpp boost/dll/shared_library.hpp boost/crc.hpp dlpack/dlpack.h
               CLI/CLI.hpp gtest/gtest.h gloo/allreduce.h google/protobuf/message.h zlib.h)

usage() {
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

mode=run
py=""
build_dir=""
minutes=8
out=""
all_targets=0
while (($#)); do
  case $1 in
    --prepare) mode=prepare ;;
    --python | --build-dir | --minutes | --out)
      if (($# < 2)); then echo "$me: error: $1 needs a value (see --help)" >&2; exit 2; fi
      case $1 in
        --python) py=$2 ;;
        --build-dir) build_dir=$2 ;;
        --minutes) minutes=$2 ;;
        --out) out=$2 ;;
      esac
      shift ;;
    --python=*) py=${1#*=} ;;
    --build-dir=*) build_dir=${1#*=} ;;
    --minutes=*) minutes=${1#*=} ;;
    --out=*) out=${1#*=} ;;
    --all-targets) all_targets=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "$me: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# ============================================================================================
# --prepare: the carry, on the build machine
# ============================================================================================

# Packages of the C library, the C++ standard library, the kernel headers and the compiler:
# every machine that builds C++ has its own.
toolchain_package() {
  [[ $1 =~ ^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl-dev|libtirpc-dev|libstdc\+\+6|libstdc\+\+-[0-9]+-dev|libgcc-s1|libgcc-[0-9]+-dev|gcc-[0-9]+|g\+\+-[0-9]+|cpp-[0-9]+|libgomp1|libquadmath0)$ ]]
}

# The packages owning a file (dpkg records /lib paths of usr-merged systems as such).
owners_of() {
  local p=$1 alt
  alt=$(realpath -e -- "$p" 2>/dev/null || echo "$p")
  { dpkg-query -S "$p" "$alt" "${alt/#\/usr\/lib\//\/lib\/}" 2>/dev/null || true; } |
    awk '{ i = index($0, ": /"); if (i) print substr($0, 1, i - 1) }' | tr ',' '\n' | sed 's/^ *//; s/:.*//' | sort -u
}

from_toolchain() {
  local o
  while read -r o; do
    [ -n "$o" ] && toolchain_package "$o" && return 0
  done < <(owners_of "$1")
  return 1
}

# Copies a file (or a symlink and what it points to) to the same absolute path under the
# sysroot; directories are canonical (/lib/x86_64-linux-gnu is /usr/lib/x86_64-linux-gnu on a
# usr-merged system) and links become relative, so the sysroot works wherever it lands.
declare -A copied=()
to_sysroot() {
  local p=$1 d n target rel
  d=$(realpath -e -- "$(dirname -- "$p")") || return 1
  n=$(basename -- "$p")
  [ -n "${copied[$d/$n]:-}" ] && return 0
  copied[$d/$n]=1
  mkdir -p "$S$d"
  if [ -L "$d/$n" ]; then
    target=$(realpath -e -- "$d/$n") || return 1
    to_sysroot "$target" || return 1
    rel=$(realpath -m --relative-to="$d" -- "$target")
    ln -sfn "$rel" "$S$d/$n"
  else
    cp -p -- "$d/$n" "$S$d/$n"
  fi
}

# A library with the links next to it that point to the same file (its SONAME and dev links).
library_to_sysroot() {
  local p=$1 real d stem l
  real=$(realpath -e -- "$p") || return 1
  to_sysroot "$p" || return 1
  to_sysroot "$real"
  d=$(dirname -- "$real")
  stem=$(basename -- "$real")
  stem=${stem%%.so*}
  stem=${stem%.a}
  for l in "$d/$stem".so* "$d/$stem".a; do
    [ -L "$l" ] && [ "$(realpath -e -- "$l" 2>/dev/null)" = "$real" ] && to_sysroot "$l"
  done
  return 0
}

# The shared libraries a binary or library loads, but for the toolchain's: carried too.
runtime_deps_to_sysroot() {
  local f=$1 dep
  while read -r dep; do
    [ -n "$dep" ] || continue
    case $(basename -- "$dep") in
      libc.so.* | libm.so.* | libstdc++.so.* | libgcc_s.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
    esac
    from_toolchain "$dep" && continue
    if [ -z "${copied[$(realpath -e -- "$dep")]:-}" ]; then
      library_to_sysroot "$dep" && echo "$dep" >> "$tmp/runtime-libs"
    fi
  done < <(ldd -- "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
}

prepare() {
  local b=${build_dir:-build} f need missing=()
  # A finished build: the programs and at least one GoogleTest suite (whose headers are
  # carried too); the header list is the objects' own, so a half-built tree would miss some.
  need=(build.ninja .ninja_deps CMakeCache.txt bin/hasten bin/hasten-fashion-mnist bin/hasten-char-lm
        bin/hasten-example)
  for f in "${need[@]}"; do [ -e "$b/$f" ] || missing+=("$b/$f"); done
  compgen -G "$b/bin/hasten_*_tests" >/dev/null || missing+=("$b/bin/hasten_*_tests")
  if ((${#missing[@]})); then
    echo "$me: --prepare: the build in $b/ is not there yet (no ${missing[*]}): run \`make build\` first" >&2
    return 1
  fi
  for f in ninja dpkg-query ldd perl realpath; do
    command -v "$f" >/dev/null 2>&1 || { echo "$me: --prepare: needs $f on this machine" >&2; return 1; }
  done
  for f in "${fmnist_files[@]}"; do
    [ -f "$fmnist_system/$f" ] || { echo "$me: --prepare: no $fmnist_system/$f: run scripts/install-deps.sh (dataset-fashion-mnist)" >&2; return 1; }
  done
  [ -d "$fortunes_system" ] || { echo "$me: --prepare: no $fortunes_system: run scripts/install-deps.sh (fortunes)" >&2; return 1; }

  tmp=$(mktemp -d)
  local stage="$carry_dir.new"
  trap 'rm -rf "$tmp" "$root/$carry_dir.new"' EXIT
  rm -rf -- "$stage"
  S="$root/$stage/sysroot"
  mkdir -p "$S" "$stage/data/fashion-mnist" "$stage/data/fortunes"
  : > "$tmp/runtime-libs"

  # --- data ---------------------------------------------------------------------------------
  for f in "${fmnist_files[@]}"; do cp -p -- "$fmnist_system/$f" "$stage/data/fashion-mnist/"; done
  # hasten-char-lm reads every plain file there: not the .dat indexes, not the .u8 links.
  local n
  for f in "$fortunes_system"/*; do
    n=$(basename -- "$f")
    case $n in *.dat | *.u8 | .*) continue ;; esac
    [ -f "$f" ] && cp -pL -- "$f" "$stage/data/fortunes/$n"
  done

  # --- headers: exactly those the build's objects read, outside the toolchain's -------------
  ninja -C "$b" -t deps > "$tmp/deps" 2>/dev/null || { echo "$me: --prepare: \`ninja -C $b -t deps\` failed" >&2; return 1; }
  sed -n 's/^[[:space:]]\{1,\}\(\/.*\)$/\1/p' "$tmp/deps" | sort -u | xargs -r -d '\n' realpath -ms -- | sort -u > "$tmp/read"
  grep '^/usr/include/' "$tmp/read" > "$tmp/usr-include" || true
  # dpkg-query -S in one call: "pkg[:arch][, pkg...]: /path"; unowned paths go to stderr.
  xargs -r -d '\n' dpkg-query -S < "$tmp/usr-include" > "$tmp/owned" 2> "$tmp/unowned" || true
  awk '{ i = index($0, ": /"); if (i) print substr($0, i + 2) "\t" substr($0, 1, i - 1) }' "$tmp/owned" |
    sort -u > "$tmp/path-owner"
  : > "$tmp/headers"
  : > "$tmp/packages"
  local path owners o keep
  while IFS=$'\t' read -r path owners; do
    keep=1
    while read -r o; do toolchain_package "$o" && keep=0; done < <(echo "$owners" | tr ',' '\n' | sed 's/^ *//; s/:.*//')
    if ((keep)); then
      echo "$path" >> "$tmp/headers"
      echo "$owners" | tr ',' '\n' | sed 's/^ *//; s/:.*//' >> "$tmp/packages"
    fi
  done < "$tmp/path-owner"
  # Headers no package owns (installed by hand): carried, they are not the toolchain's.
  sed -n 's/^dpkg-query: no path found matching pattern \(\/usr\/include\/.*\)$/\1/p' "$tmp/unowned" > "$tmp/unowned-headers"
  cat "$tmp/unowned-headers" >> "$tmp/headers"
  sort -u -o "$tmp/packages" "$tmp/packages"
  # What CMake's find modules read besides (FindProtobuf: service.h and the version in
  # stubs/common.h; FindZLIB: the version in zlib.h), and the .proto files protoc imports
  # (tensorboard's hparams.proto imports google/protobuf/struct.proto).
  for f in /usr/include/google/protobuf/service.h /usr/include/google/protobuf/stubs/common.h \
           /usr/include/zlib.h /usr/include/zconf.h /usr/include/boost/version.hpp; do
    [ -f "$f" ] && echo "$f" >> "$tmp/headers"
  done
  while read -r o; do
    dpkg-query -L "$o" 2>/dev/null | grep -E '^/usr/include/.*\.proto$' >> "$tmp/headers" || true
  done < "$tmp/packages"
  sort -u -o "$tmp/headers" "$tmp/headers"
  while read -r f; do to_sysroot "$f" || echo "$me: --prepare: warning: could not copy $f" >&2; done < "$tmp/headers"

  # --- CMake packages: the config directories the configure used (its cache's <Pkg>_DIR) ----
  : > "$tmp/cmake-dirs"
  local entry name dir
  while IFS= read -r entry; do
    name=${entry%%:*}
    dir=${entry#*=}
    case $dir in /usr/lib/* | /usr/share/* | /lib/*) ;; *) continue ;; esac
    compgen -G "$dir/*[Cc]onfig.cmake" >/dev/null || continue
    echo "$name $dir" >> "$tmp/cmake-dirs"
  done < <(grep -E '^[A-Za-z0-9_.+-]+_DIR:PATH=/' "$b/CMakeCache.txt")
  : > "$tmp/libs"
  local cfg ref
  while read -r name dir; do
    for cfg in "$dir"/*.cmake; do
      to_sysroot "$cfg"
      # Files the package's targets name, as ${_IMPORT_PREFIX}/... (the prefix is /usr here)
      # or as absolute paths (Gloo's targets name /usr/lib/libgloo.so.0.5.0).
      while read -r ref; do
        [ -f "$ref" ] && echo "$ref" >> "$tmp/libs"
      done < <(perl -ne 'while (/\$\{_IMPORT_PREFIX\}(\/[^"\s;)]+)/g) { print "/usr$1\n" } while (/"(\/(?:usr\/)?lib\/[^"\s;]+)"/g) { print "$1\n" }' "$cfg")
    done
  done < "$tmp/cmake-dirs"

  # --- libraries the targets link, and what find modules found (FindProtobuf, FindZLIB) -----
  grep -E '^[[:space:]]+LINK_LIBRARIES = ' "$b/build.ninja" | tr ' ' '\n' |
    grep -E '^/(usr/)?lib/.*\.(so(\.[0-9]+)*|a)$' >> "$tmp/libs" || true
  local l dirs
  while read -r l; do
    for dirs in /usr/lib/x86_64-linux-gnu /usr/lib; do
      if [ -e "$dirs/lib$l.so" ]; then echo "$dirs/lib$l.so" >> "$tmp/libs"; break; fi
      if [ -e "$dirs/lib$l.a" ]; then echo "$dirs/lib$l.a" >> "$tmp/libs"; break; fi
    done
  done < <(grep -E '^[[:space:]]+LINK_LIBRARIES = ' "$b/build.ninja" | tr ' ' '\n' | sed -n 's/^-l\([A-Za-z0-9_+.-]*\)$/\1/p' | sort -u)
  # What find modules found (FindProtobuf, FindZLIB): the cache's <Pkg>_..._LIBRARY... entries.
  grep -E '^[A-Za-z0-9]+_[A-Za-z0-9_]*LIBRARY[A-Za-z0-9_]*:FILEPATH=/(usr/)?lib/' "$b/CMakeCache.txt" > "$tmp/cache-libs" || true
  cut -d= -f2- "$tmp/cache-libs" >> "$tmp/libs"
  sort -u -o "$tmp/libs" "$tmp/libs"
  : > "$tmp/carried-libs"
  while read -r l; do
    [ -e "$l" ] || continue
    from_toolchain "$l" && continue
    library_to_sysroot "$l" && echo "$l" >> "$tmp/carried-libs"
  done < "$tmp/libs"
  # Programs of the packages whose libraries are carried (Protobuf_PROTOC_EXECUTABLE: protoc
  # runs during the build).
  : > "$tmp/cache-entries"
  local prefixes="" progs=()
  while IFS= read -r entry; do
    grep -qxF -- "${entry#*=}" "$tmp/carried-libs" || continue
    echo "$entry" >> "$tmp/cache-entries"
    prefixes+=" ${entry%%_*}"
  done < "$tmp/cache-libs"
  for name in $(tr ' ' '\n' <<< "$prefixes" | sort -u); do
    while IFS= read -r entry; do
      progs+=("${entry#*=}")
      echo "$entry" >> "$tmp/cache-entries"
    done < <(grep -E "^${name}_[A-Za-z0-9_]*EXECUTABLE:FILEPATH=/usr/bin/" "$b/CMakeCache.txt")
  done
  while read -r l; do
    case $l in *.so*) runtime_deps_to_sysroot "$l" ;; esac
  done < "$tmp/carried-libs"
  local p real
  for p in ${progs[@]+"${progs[@]}"}; do
    real=$(realpath -e -- "$p") || continue
    # The real program beside a wrapper that finds its libraries in the sysroot.
    mkdir -p "$S/usr/bin"
    cp -p -- "$real" "$S/usr/bin/$(basename -- "$p").bin"
    runtime_deps_to_sysroot "$real"
    cat > "$S/usr/bin/$(basename -- "$p")" <<'EOF'
#!/bin/sh
# gpu-check's carried program: the real one is "$0.bin", its libraries are in this sysroot.
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib/x86_64-linux-gnu:$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/$(basename "$0").bin" "$@"
EOF
    chmod +x "$S/usr/bin/$(basename -- "$p")"
  done

  # Config files that name files by absolute path: relative to the file instead, so that
  # they name the sysroot's copies wherever it lands.
  local sdir
  while read -r name dir; do
    sdir="$S$(realpath -e -- "$dir")"
    for cfg in "$sdir"/*.cmake; do
      perl -pi -e 'BEGIN { use File::Spec; use Cwd (); $d = shift @ARGV }
                   s{"(/(?:usr/)?lib/[^"\s;]+)"}{ -f $1 ? "\"\${CMAKE_CURRENT_LIST_DIR}/" . File::Spec->abs2rel(Cwd::abs_path($1), $d) . "\"" : "\"$1\"" }ge' \
        "$(realpath -e -- "$dir")" "$cfg"
    done
  done < "$tmp/cmake-dirs"

  # The cache entries gpu-check.sh passes back to CMake on the GPU machine (@SYSROOT@: the
  # sysroot there): the same answers the configure found here, relocated.
  {
    echo "# <Pkg>_DIR, include, library and program cache entries of $b's configure, relocated (gpu-check.sh)"
    while read -r name dir; do echo "$name:PATH=@SYSROOT@$(realpath -e -- "$dir")"; done < "$tmp/cmake-dirs"
    while IFS= read -r entry; do
      f=${entry#*=}
      [ -e "$S$(realpath -m -- "$(dirname -- "$f")")/$(basename -- "$f")" ] || continue
      echo "${entry%%=*}=@SYSROOT@$(realpath -m -- "$(dirname -- "$f")")/$(basename -- "$f")"
    done < "$tmp/cache-entries"
    grep -E '^[A-Za-z0-9_]+_INCLUDE_DIR:PATH=/usr/include$' "$b/CMakeCache.txt" | sed 's#=/usr/include$#=@SYSROOT@/usr/include#'
  } > "$S/cmake-cache.txt"

  # --- what is carried, and how big ---------------------------------------------------------
  {
    echo "# .gpu-carry, made by scripts/gpu-check.sh --prepare on $(hostname) $(date -u +%Y-%m-%dT%H:%M:%SZ) from $b/"
    echo "# third-party packages whose headers the build read:"
    sed 's/^/#   /' "$tmp/packages" | grep -v -E '^#   $' || true
    echo "# files (relative to .gpu-carry):"
    (cd "$stage" && find . -type f -o -type l | sed 's#^\./##' | sort)
  } > "$stage/MANIFEST"
  local bytes
  bytes=$(du -sb "$stage" | cut -f1)
  if ((bytes > carry_limit_bytes)); then
    echo "$me: --prepare: the carry would be $((bytes / 1048576)) MiB, over the ~60 MiB the device tool takes:" >&2
    du -sh "$stage"/data/* "$stage"/sysroot/usr/* 2>/dev/null | sort -h | tail -5 >&2
    rm -rf -- "$stage"
    return 1
  fi
  rm -rf -- "$carry_dir"
  mv -- "$stage" "$carry_dir"
  trap - EXIT
  rm -rf "$tmp"

  local s=$carry_dir/sysroot
  echo "$me: --prepare: made $carry_dir/ from $b/ (list: $carry_dir/MANIFEST)"
  echo "  third-party packages whose headers the build read: $(sed -n 's/^#   //p' "$carry_dir/MANIFEST" | paste -sd' ')"
  echo "  headers: $(find "$s/usr/include" -type f ! -name '*.proto' | wc -l) (+ $(find "$s/usr/include" -name '*.proto' | wc -l) .proto);" \
       "libraries: $(find "$s/usr/lib" -maxdepth 2 -type f -name 'lib*' | wc -l) files (+ links:" \
       "$(find "$s/usr/lib" -maxdepth 2 -type l -name 'lib*' | wc -l));" \
       "programs: $(find "$s/usr/bin" -type f ! -name '*.bin' 2>/dev/null | wc -l); CMake packages: $(grep -v '_INCLUDE_DIR:' "$s/cmake-cache.txt" | grep -c '_DIR:PATH=')"
  for f in "$carry_dir/data/fashion-mnist" "$carry_dir/data/fortunes" "$carry_dir/sysroot" "$carry_dir"; do
    du -sh "$f" | sed 's/^/  /'
  done
  echo "  size: $bytes bytes ($((bytes / 1048576)) MiB; the device tool carries 64 MiB in all)"
  echo "device tool: run(command=\"scripts/gpu-check.sh --out \\\"\$OUT\\\"\", carry=[\"$carry_dir\"], timeout_s=600)"
  return 0
}

if [ "$mode" = prepare ]; then
  prepare
  exit $?
fi

# ============================================================================================
# The check, on the GPU machine
# ============================================================================================

if ! [[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || [ "$(awk -v m="$minutes" 'BEGIN { print (m >= 1) }')" != 1 ]; then
  echo "$me: error: --minutes '$minutes' is not a number of minutes >= 1" >&2
  exit 2
fi
start_s=$(date +%s)
deadline=$((start_s + $(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')))

# The interpreter with torch: --python, else the project's .venv, else python3.
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
if [[ $py == */* ]]; then
  [[ $py == /* ]] || py="$root/$py"
  [ -x "$py" ] || py=""
else
  py=$(command -v "$py" 2>/dev/null || true)
fi
if [ -z "$py" ]; then
  echo "$me: FAIL: no Python interpreter to use (pass --python PY, one whose torch has CUDA)" >&2
  exit 1
fi

nvsmi=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvsmi=$(timeout 30 nvidia-smi -L 2>&1 | grep -v '^$' || true)
fi
machine=$(timeout 120 "$py" - 2>&1 <<'EOF'
import sys
try:
    import torch
except Exception as e:  # noqa: BLE001
    print("error=cannot import torch (%s)" % str(e).splitlines()[0])
    sys.exit(3)
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print("torch=%s" % torch.__version__)
print("cuda=%s" % (torch.version.cuda or "none"))
print("gpus=%d" % n)
for i in range(n):
    p = torch.cuda.get_device_properties(i)
    print("gpu=%d: %s, %.0f GiB, sm_%d%d" % (i, p.name, p.total_memory / 2**30, p.major, p.minor))
print("python=%s" % sys.version.split()[0])
EOF
)
machine_rc=$?
field() { sed -n "s/^$1=//p" <<< "$machine" | head -n1; }
torch_v=$(field torch)
cuda_v=$(field cuda)
gpus=$(field gpus)
if [ -n "$nvsmi" ]; then
  smi_note="nvidia-smi -L: $(head -n1 <<< "$nvsmi")$( (($(wc -l <<< "$nvsmi") > 1)) && echo " (+$(($(wc -l <<< "$nvsmi") - 1)) more)")"
elif command -v nvidia-smi >/dev/null 2>&1; then
  smi_note="nvidia-smi -L: no answer"
else
  smi_note="nvidia-smi: not found"
fi
if ((machine_rc == 124)); then
  echo "$me: FAIL: $py did not import torch and count the GPUs within 120 s; $smi_note" >&2
  exit 1
elif [ -z "$torch_v" ]; then
  why=$(field error)
  [ -n "$why" ] || why=$(tail -n1 <<< "$machine")
  echo "$me: FAIL: no torch in $py (${why:-no answer}); pass --python PY, one whose torch has CUDA" >&2
  exit 1
elif [ "$cuda_v" = none ]; then
  echo "$me: FAIL: torch $torch_v in $py is a CPU-only build (no CUDA); $smi_note" >&2
  exit 1
elif ! [[ ${gpus:-0} =~ ^[0-9]+$ ]] || [ "${gpus:-0}" -lt 1 ]; then
  echo "$me: FAIL: no GPU visible: torch $torch_v (CUDA $cuda_v) in $py sees 0 CUDA devices (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}); $smi_note" >&2
  exit 1
fi

# From here on every step reports PASS or FAIL and the run goes on to its summary.
bdir=${build_dir:-build-gpu}
[[ $bdir == /* ]] || bdir="$root/$bdir"
out=${out:-$bdir/gpu-check}
[[ $out == /* ]] || out="$root/$out"
runs="$bdir/gpu-check-runs"
home="$runs/hasten_home"  # a private HASTEN_HOME: no personal default config leaks in

names=()
results=()
notes=()
record() {  # record STEP PASS|FAIL NOTE
  names+=("$1")
  results+=("$2")
  notes+=("$3")
  echo "$me: [$2] $1: $3"
}
now() { date +%s; }
# Seconds a step may take: at most CAP, leaving RESERVE seconds for the steps after it.
budget() {
  local cap=$1 reserve=$2 left
  left=$((deadline - $(now) - reserve))
  ((left < cap)) && echo "$left" || echo "$cap"
}
too_late() {  # too_late STEP SECONDS: records a FAIL when the deadline leaves under 10 s
  if (($2 < 10)); then
    record "$1" FAIL "not run: the ${minutes}-minute deadline leaves no time for it"
    return 0
  fi
  return 1
}
last_lines() { tail -n "${2:-3}" "$1" 2>/dev/null | tr '\n' ' ' | tr -s ' ' | cut -c1-400; }

echo "$me: machine: ${nvsmi:-nvidia-smi: not found}" | sed "2,\$s/^/$me: machine: /"
sed -n 's/^gpu=/gpu-check: machine: torch sees GPU /p' <<< "$machine"
record "a machine" PASS "torch $torch_v (CUDA $cuda_v), $gpus GPU(s), Python $(field python) ($py)"

# --- b. build prerequisites -------------------------------------------------------------------
S="$root/$carry_dir/sysroot"
use_sysroot=0
[ -d "$S/usr" ] && use_sysroot=1
PATH="$PATH:$(dirname -- "$py")"  # cmake and ninja from pip sit next to the interpreter
missing=()
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
if command -v cmake >/dev/null 2>&1; then
  cmake_v=$(cmake --version | sed -n '1s/.* version \([0-9.]*\).*/\1/p')
  version_ge "${cmake_v:-0}" 3.22 || missing+=("cmake >= 3.22 (found ${cmake_v:-?})")
else
  missing+=("cmake >= 3.22")
fi
command -v ninja >/dev/null 2>&1 || missing+=("ninja")
cxx=${CXX:-g++}
cc=${CC:-gcc}
if command -v "$cxx" >/dev/null 2>&1; then
  cxx=$(command -v "$cxx")
  if "$cxx" --version 2>/dev/null | grep -q 'Free Software Foundation'; then
    gxx_v=$("$cxx" -dumpfullversion -dumpversion 2>/dev/null | head -n1)
    gxx_major=${gxx_v%%.*}
    [[ $gxx_major =~ ^[0-9]+$ ]] && ((gxx_major >= 12)) || missing+=("g++ >= 12 (found ${gxx_v:-?})")
  elif [ -z "${CXX:-}" ]; then
    missing+=("g++ >= 12 ($cxx is not GCC)")
  fi
else
  missing+=("g++ >= 12")
fi
cuda_root=""
if ! command -v nvcc >/dev/null 2>&1; then
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13* /opt/cuda; do
    if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then cuda_root=$d; PATH="$d/bin:$PATH"; break; fi
  done
  [ -n "$cuda_root" ] || missing+=("nvcc (the CUDA toolkit: the CUDA wheel's CMake package needs it)")
fi
incdirs=()
((use_sysroot)) && incdirs+=("$S/usr/include")
IFS=: read -r -a extra_inc <<< "${CPLUS_INCLUDE_PATH:-}:${CPATH:-}"
for d in ${extra_inc[@]+"${extra_inc[@]}"}; do [ -n "$d" ] && incdirs+=("$d"); done
incdirs+=(/usr/include /usr/local/include)
headers_missing=()
for h in "${probe_headers[@]}"; do
  found=0
  for d in "${incdirs[@]}"; do [ -f "$d/$h" ] && { found=1; break; }; done
  ((found)) || headers_missing+=("$h")
done
((${#headers_missing[@]})) && missing+=("headers ${headers_missing[*]}")
if ! { ((use_sysroot)) && [ -x "$S/usr/bin/protoc" ]; } && ! command -v protoc >/dev/null 2>&1; then
  missing+=("protoc")
fi
py_missing=$("$py" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' \
  numpy safetensors tensorboard accelerate 2>/dev/null)
[ -n "$py_missing" ] && missing+=("Python modules in $py: $py_missing")
if ((${#missing[@]})); then
  joined=$(printf '%s; ' "${missing[@]}")
  echo "$me: FAIL: missing build prerequisites: ${joined%; } ($carry_dir/sysroot: $( ((use_sysroot)) && echo used || echo 'absent: run scripts/gpu-check.sh --prepare on the build machine and carry .gpu-carry'))" >&2
  exit 2
fi
record "b prerequisites" PASS "cmake $cmake_v, ninja $(ninja --version), $(basename "$cxx") ${gxx_v:-?}, nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $carry_dir/sysroot $( ((use_sysroot)) && echo used || echo 'not there (the machine has everything)')"

mkdir -p "$bdir" "$out" "$runs" "$home"

# What the build and hasten's programs need from the sysroot.
run_env=()
if ((use_sysroot)); then
  sys_libs="$S/usr/lib/x86_64-linux-gnu:$S/usr/lib"
  run_env=(env "LD_LIBRARY_PATH=$sys_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
hasten_env=(${run_env[@]+"${run_env[@]}"} env "HASTEN_HOME=$home" HASTEN_LOG_LEVEL=debug)

# --- c. configure and build -----------------------------------------------------------------
# Reserves: what the later steps need at least, so that a slow build cannot eat them.
reserve_after_build=190
cmake_args=(-S "$root" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHASTEN_PYTHON="$py" -DHASTEN_CUDA=ON
            -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
command -v "$cc" >/dev/null 2>&1 && cmake_args+=(-DCMAKE_C_COMPILER="$(command -v "$cc")")
[ -n "$cuda_root" ] && cmake_args+=(-DCUDAToolkit_ROOT="$cuda_root")
build_env=(env)
if ((use_sysroot)); then
  cmake_args+=(-DCMAKE_PREFIX_PATH="$S/usr" -DCMAKE_INCLUDE_PATH="$S/usr/include"
               -DCMAKE_LIBRARY_PATH="$S/usr/lib/x86_64-linux-gnu;$S/usr/lib" -DCMAKE_PROGRAM_PATH="$S/usr/bin")
  if [ -f "$S/cmake-cache.txt" ]; then
    while IFS= read -r entry; do
      [[ -z $entry || $entry == \#* ]] && continue
      cmake_args+=("-D${entry//@SYSROOT@/$S}")
    done < "$S/cmake-cache.txt"
  fi
  # Headers a target reaches without naming a package, and libraries named by -l.
  build_env=(env "CPLUS_INCLUDE_PATH=$S/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
             "C_INCLUDE_PATH=$S/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
             "LIBRARY_PATH=$sys_libs${LIBRARY_PATH:+:$LIBRARY_PATH}"
             "LD_LIBRARY_PATH=$sys_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
built=0
t=$(budget 240 $((reserve_after_build + 60)))
if ! too_late "c configure+build" "$t"; then
  c_start=$(now)
  timeout -k 10 "$t" "${build_env[@]}" cmake "${cmake_args[@]}" > "$out/configure.log" 2>&1
  rc=$?
  summary_line=$(grep -m1 '^hasten: LibTorch' "$out/configure.log" || true)
  if ((rc != 0)); then
    if ((rc == 124)); then
      why="timed out after ${t} s"
    else
      why=$(grep -m3 -A2 'CMake Error\|hasten: ' "$out/configure.log" | tr '\n' ' ' | tr -s ' ' | cut -c1-400)
    fi
    record "c configure+build" FAIL "cmake failed (${why:-$(last_lines "$out/configure.log")}); log $out/configure.log"
  elif [[ $summary_line != *"with CUDA"* ]]; then
    record "c configure+build" FAIL "configured without the CUDA paths: ${summary_line:-no 'hasten: LibTorch' line}; log $out/configure.log"
  else
    echo "$me: $summary_line"
    targets=()
    if ((all_targets == 0)); then
      # The gpu tests, the CLI, the examples, the tracker host and every plugin; not the CPU
      # suites, the benchmark runner or the integration-test helpers (time).
      mapfile -t available < <(ninja -C "$bdir" -t targets all 2>/dev/null | sed -n 's/^\([^:/]*\): phony$/\1/p' | sort -u)
      for name in "${available[@]}"; do
        case $name in
          hasten_gpu_tests | hasten_nccl_tests | hasten_cli | hasten-example | hasten-fashion-mnist | hasten-char-lm | \
            hasten-tracker-host | hasten-strategy-* | hasten-precision-* | hasten-tracker-* | hasten-comm-*)
            targets+=("$name") ;;
        esac
      done
    fi
    t=$(budget 100000 "$reserve_after_build")
    if ! too_late "c configure+build" "$t"; then
      b_start=$(now)
      if ((${#targets[@]})); then
        timeout -k 10 "$t" "${build_env[@]}" cmake --build "$bdir" -j "$(nproc)" --target "${targets[@]}" -- -k 0 > "$out/build.log" 2>&1
      else
        timeout -k 10 "$t" "${build_env[@]}" cmake --build "$bdir" -j "$(nproc)" -- -k 0 > "$out/build.log" 2>&1
      fi
      rc=$?
      if ((rc == 0)); then
        built=1
        record "c configure+build" PASS "$summary_line; configured in $((b_start - c_start)) s, built ${#targets[@]} targets$( ((${#targets[@]})) || echo ' (all)') in $(($(now) - b_start)) s with -j$(nproc)"
      elif ((rc == 124)); then
        record "c configure+build" FAIL "the build did not finish in ${t} s (the deadline keeps ${reserve_after_build} s for the rest; --minutes 9.5 gives it 90 s more within the device tool's 10 minutes, and a rerun in the same build directory continues it); log $out/build.log"
      else
        # -k 0 built every target it could: the later steps run with what is there (one broken
        # plugin does not cost the whole check on a machine lent for minutes).
        failed_targets=$(grep -c '^FAILED:' "$out/build.log")
        record "c configure+build" FAIL "the build failed ($failed_targets commands): $(grep -m2 -E 'error:|Error [0-9]|FAILED:' "$out/build.log" | tr '\n' ' ' | cut -c1-400); log $out/build.log; the later steps run with what was built"
        built=1
      fi
    fi
  fi
fi

not_built() { record "$1" FAIL "not run: nothing was built (step c)"; }

# --- d. ctest -L gpu --------------------------------------------------------------------------
if ((built == 0)); then
  not_built "d ctest -L gpu"
else
  t=$(budget 150 130)
  if ! too_late "d ctest -L gpu" "$t"; then
    rm -f "$out/ctest-gpu.xml"
    (cd "$bdir" && timeout -k 10 "$t" ${run_env[@]+"${run_env[@]}"} ctest -L gpu --output-on-failure \
       --output-junit "$out/ctest-gpu.xml") > "$out/ctest-gpu.log" 2>&1
    rc=$?
    verdict=$("$py" - "$out/ctest-gpu.xml" "$out/ctest-gpu.log" "$gpus" <<'EOF'
import re, sys, xml.etree.ElementTree as ET
junit, log, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
tests = []  # (name, status, output)
try:
    for case in ET.parse(junit).getroot().iter("testcase"):
        status = case.get("status", "run")
        if case.find("failure") is not None or status in ("fail", "failed"):
            status = "fail"
        elif case.find("skipped") is not None or status in ("notrun", "skipped", "disabled"):
            status = "skip"
        else:
            status = "pass"
        tests.append((case.get("name"), status, case.findtext("system-out") or ""))
except (OSError, ET.ParseError):
    text = open(log, errors="replace").read()
    for m in re.finditer(r"Test\s+#\d+: (\S+) \.*\s*(\*\*\*)?(Passed|Failed|Skipped|Not Run|Timeout|Exception)?", text):
        s = {"Passed": "pass", "Skipped": "skip", "Not Run": "skip"}.get(m.group(3), "fail")
        tests.append((m.group(1), s, ""))
failed = [n for n, s, _ in tests if s == "fail"]
fewer, other = [], []
for n, s, text in tests:
    if s != "skip":
        continue
    m = re.search(r"needs (\d+) CUDA devices?; this machine has (\d+)", text)
    if m and int(m.group(2)) == gpus >= 1 and int(m.group(1)) > gpus:
        fewer.append("%s (needs %s GPUs)" % (n, m.group(1)))
    else:
        reason = re.search(r"(?:Skipped|SKIPPED)[^\n]*\n?([^\n]*)", text)
        other.append(n + (" (%s)" % reason.group(1).strip()[:80] if reason and reason.group(1).strip() else ""))
passed = sum(1 for _, s, _ in tests if s == "pass")
ok = tests and not failed and not other
print("%s %d tests: %d passed, %d failed%s, %d skipped%s%s" % (
    "PASS" if ok else "FAIL", len(tests), passed, len(failed), (" (" + ", ".join(failed[:5]) + ")") if failed else "",
    len(fewer) + len(other), (" on a GPU machine: " + ", ".join(other[:5])) if other else "",
    ("; left out, this machine has too few GPUs: " + ", ".join(fewer)) if fewer else ""))
EOF
)
    if ((rc == 124)); then
      record "d ctest -L gpu" FAIL "timed out after ${t} s; ${verdict#* }; log $out/ctest-gpu.log"
    elif [ -z "$verdict" ] || grep -q 'No tests were found' "$out/ctest-gpu.log"; then
      record "d ctest -L gpu" FAIL "no gpu-labelled tests ran ($(last_lines "$out/ctest-gpu.log" 2)); log $out/ctest-gpu.log"
    elif [[ $verdict == PASS* ]] && ((rc == 0)); then
      record "d ctest -L gpu" PASS "${verdict#PASS }"
    else
      record "d ctest -L gpu" FAIL "${verdict#* } (ctest exit $rc); log $out/ctest-gpu.log"
    fi
  fi
fi

# Where a program ran: hasten's debug line "accelerator: ... device cuda:0, rank 0/1".
device_of() { grep -m1 -o 'device cuda:[0-9]*\|device cpu' "$1" 2>/dev/null | sed 's/^device //'; }

# --- e. Fashion-MNIST on the GPU --------------------------------------------------------------
fm_epochs=${GPU_CHECK_FMNIST_EPOCHS:-5}
fm_accuracy=""
fm_project="$runs/fashion-mnist"
if ((built == 0)); then
  not_built "e fashion-mnist"
else
  fm_data=""
  for d in "$fmnist_system" "$root/$carry_dir/data/fashion-mnist"; do
    [ -f "$d/train-images-idx3-ubyte.gz" ] && { fm_data=$d; break; }
  done
  t=$(budget 120 85)
  if [ -z "$fm_data" ]; then
    record "e fashion-mnist" FAIL "no Fashion-MNIST: neither $fmnist_system nor $carry_dir/data/fashion-mnist (scripts/gpu-check.sh --prepare)"
  elif ! too_late "e fashion-mnist" "$t"; then
    rm -rf "$fm_project"
    e_start=$(now)
    timeout -k 10 "$t" "${hasten_env[@]}" "$bdir/bin/hasten-fashion-mnist" --epochs "$fm_epochs" --batch_size 64 --lr 1e-3 \
      --quiet --data_dir "$fm_data" --project_dir "$fm_project" --trackers tensorboard csv > "$out/fashion-mnist.log" 2>&1
    rc=$?
    fm_accuracy=$(sed -n 's/.*done: test accuracy \([0-9.]*\).*/\1/p' "$out/fashion-mnist.log" | tail -n1)
    dev=$(device_of "$out/fashion-mnist.log")
    per_epoch=$(sed -n 's/.*epoch \([0-9]*\/[0-9]*\): test accuracy \([0-9.]*\).*/\2/p' "$out/fashion-mnist.log" | paste -sd' ')
    line="test accuracy ${fm_accuracy:-none} after $fm_epochs epochs of batch 64 on ${dev:-an unknown device} (per epoch: ${per_epoch:-none}), $(($(now) - e_start)) s"
    if ((rc != 0)); then
      record "e fashion-mnist" FAIL "exit $rc$( ((rc == 124)) && echo " (timed out after ${t} s)"): $(last_lines "$out/fashion-mnist.log" 2); log $out/fashion-mnist.log"
    elif [[ $dev != cuda* ]]; then
      record "e fashion-mnist" FAIL "did not run on a GPU: $line"
    elif [ -n "$fm_accuracy" ] && awk -v a="$fm_accuracy" 'BEGIN { exit !(a >= 0.90) }'; then
      record "e fashion-mnist" PASS "$line"
    else
      record "e fashion-mnist" FAIL "below 0.90: $line"
    fi
  fi
fi

# --- f. the char LM on the GPU ----------------------------------------------------------------
lm_steps=${GPU_CHECK_CHARLM_STEPS:-300}
lm_project="$runs/char-lm"
lm_weights="$lm_project/weights"
if ((built == 0)); then
  not_built "f char-lm"
else
  lm_data=""
  for d in "$fortunes_system" "$root/$carry_dir/data/fortunes"; do
    [ -f "$d/fortunes" ] && { lm_data=$d; break; }
  done
  t=$(budget 60 60)
  if [ -z "$lm_data" ]; then
    record "f char-lm" FAIL "no fortunes corpus: neither $fortunes_system nor $carry_dir/data/fortunes (scripts/gpu-check.sh --prepare)"
  elif ! too_late "f char-lm" "$t"; then
    rm -rf "$lm_project"
    f_start=$(now)
    timeout -k 10 "$t" "${hasten_env[@]}" "$bdir/bin/hasten-char-lm" --max_steps "$lm_steps" --quiet --data_dir "$lm_data" \
      --project_dir "$lm_project" --log_with tensorboard csv --save_model "$lm_weights" --sample_chars 200 \
      > "$out/char-lm.log" 2>&1
    rc=$?
    read -r lm_loss lm_entropy < <(sed -n 's/.*done: validation loss \([0-9.]*\) nats\/char (unigram entropy \([0-9.]*\)).*/\1 \2/p' "$out/char-lm.log" | tail -n1)
    dev=$(device_of "$out/char-lm.log")
    line="validation loss ${lm_loss:-none} nats/char after $lm_steps steps (unigram entropy ${lm_entropy:-?}) on ${dev:-an unknown device}, $(($(now) - f_start)) s; weights $lm_weights"
    if ((rc != 0)); then
      record "f char-lm" FAIL "exit $rc$( ((rc == 124)) && echo " (timed out after ${t} s)"): $(last_lines "$out/char-lm.log" 2); log $out/char-lm.log"
    elif [[ $dev != cuda* ]]; then
      record "f char-lm" FAIL "did not run on a GPU: $line"
    elif [ -n "${lm_loss:-}" ] && [ -n "${lm_entropy:-}" ] && awk -v l="$lm_loss" -v e="$lm_entropy" 'BEGIN { exit !(l < e) }'; then
      record "f char-lm" PASS "$line"
    else
      record "f char-lm" FAIL "not below the unigram entropy: $line"
    fi
  fi
fi

# --- g. our files, read by PyTorch's ecosystem ------------------------------------------------
if ((built == 0)); then
  not_built "g tensorboard+safetensors"
else
  t=$(budget 45 45)
  if ! too_late "g tensorboard+safetensors" "$t"; then
    lm_params=$(sed -n 's/.*model: .*, \([0-9]*\) parameters;.*/\1/p' "$out/char-lm.log" 2>/dev/null | head -n1)
    verdict=$(timeout -k 10 "$t" "$py" - "$fm_project" "$fm_epochs" "${fm_accuracy:-}" "$lm_project" "$lm_weights" "${lm_params:-}" \
      2> "$out/readers.log" <<'EOF'
import glob, math, os, sys
fm_project, fm_epochs, fm_accuracy, lm_project, lm_weights, lm_params = sys.argv[1:7]
problems, facts = [], []

def scalars(project, name, want):
    files = glob.glob(os.path.join(project, "**", "events.out.tfevents.*"), recursive=True)
    if not files:
        problems.append("%s: no TensorBoard event file under %s" % (name, project))
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = {}
    for run in sorted({os.path.dirname(f) for f in files}):
        acc = EventAccumulator(run, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend(acc.Scalars(tag))
    absent = [t for t in want if not out.get(t)]
    if absent:
        problems.append("%s: no scalars %s (tags: %s)" % (name, ", ".join(absent), ", ".join(sorted(out)) or "none"))
    bad = [t for t, evs in out.items() if any(not math.isfinite(e.value) for e in evs)]
    if bad:
        problems.append("%s: non-finite scalars in %s" % (name, ", ".join(bad)))
    facts.append("%s: %d scalar tags, %d values" % (name, len(out), sum(len(v) for v in out.values())))
    return out

try:
    fm = scalars(fm_project, "fashion-mnist", ["test_accuracy", "test_loss", "train_loss"])
    acc = sorted(fm.get("test_accuracy", []), key=lambda e: e.step)
    if acc and len(acc) != int(fm_epochs):
        problems.append("fashion-mnist: %d test_accuracy values for %s epochs" % (len(acc), fm_epochs))
    if acc and fm_accuracy and abs(acc[-1].value - float(fm_accuracy)) > 1e-4:
        problems.append("fashion-mnist: last test_accuracy %.5f, the program printed %s" % (acc[-1].value, fm_accuracy))
    scalars(lm_project, "char-lm", ["val_loss", "train_loss", "lr"])
except Exception as e:  # noqa: BLE001
    problems.append("tensorboard: %s: %s" % (type(e).__name__, e))

try:
    import torch
    from safetensors.torch import load_file
    files = sorted(glob.glob(os.path.join(lm_weights, "*.safetensors"))) if os.path.isdir(lm_weights) else [lm_weights]
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        problems.append("safetensors: no weights at %s" % lm_weights)
    tensors = {}
    for f in files:
        tensors.update(load_file(f))
    if files and not tensors:
        problems.append("safetensors: %s holds no tensors" % ", ".join(files))
    bad = [n for n, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        problems.append("safetensors: non-finite values in " + ", ".join(bad[:5]))
    total = sum(t.numel() for t in tensors.values())
    if lm_params and total != int(lm_params):
        problems.append("safetensors: %d values, the model has %s parameters" % (total, lm_params))
    if tensors and not any(t.dim() == 2 and t.shape[0] == 256 for t in tensors.values()):
        problems.append("safetensors: no [256, width] byte embedding among " + ", ".join(sorted(tensors)[:6]))
    if tensors:
        first = sorted(tensors)[:3]
        facts.append("weights: %d tensors, %d values (%s ...)" % (
            len(tensors), total, ", ".join("%s %s" % (n, list(tensors[n].shape)) for n in first)))
except Exception as e:  # noqa: BLE001
    problems.append("safetensors: %s: %s" % (type(e).__name__, e))

print(("FAIL " + "; ".join(problems)) if problems else ("PASS " + "; ".join(facts)))
EOF
)
    rc=$?
    if ((rc == 124)); then
      record "g tensorboard+safetensors" FAIL "timed out after ${t} s"
    elif [[ $verdict == PASS* ]]; then
      record "g tensorboard+safetensors" PASS "${verdict#PASS }"
    else
      record "g tensorboard+safetensors" FAIL "${verdict#FAIL }$(last_lines "$out/readers.log" 2)"
    fi
  fi
fi

# --- h. samples/s: hasten beside accelerate launch, one process on one GPU --------------------
bench_steps=${GPU_CHECK_BENCH_STEPS:-300}
bench_warmup=20
if ((built == 0)); then
  not_built "h hasten vs accelerate"
else
  t=$(budget 150 5)
  if ! too_late "h hasten vs accelerate" "$t"; then
    h_end=$(($(now) + t))
    bench_problems=()
    runs_left=4
    # Each run gets an equal share of what is left; the JSON summary goes to stdout.
    bench_run() {  # bench_run LABEL FILE-STEM COMMAND...
      local label=$1 stem=$2 each rc
      shift 2
      each=$(((h_end - $(now)) / runs_left))
      runs_left=$((runs_left - 1))
      if ((each < 10)); then bench_problems+=("$label: no time left"); return 1; fi
      timeout -k 5 "$each" "$@" > "$out/$stem.json" 2> "$out/$stem.log"
      rc=$?
      ((rc == 0)) || bench_problems+=("$label: exit $rc$( ((rc == 124)) && echo " (timed out after $each s)") ($(last_lines "$out/$stem.log" 1))")
      return $rc
    }
    for w in gpt-tiny mlp-large; do
      if bench_run "hasten $w" "bench-hasten-$w" "${hasten_env[@]}" "$bdir/bin/hasten-example" --workload "$w" \
           --warmup "$bench_warmup" --steps "$bench_steps" --json --quiet; then
        dev=$(device_of "$out/bench-hasten-$w.log")
        [[ $dev == cuda* ]] || bench_problems+=("hasten $w ran on ${dev:-an unknown device}")
      fi
      bench_run "accelerate $w" "bench-accelerate-$w" "$py" -m accelerate.commands.launch --num_processes 1 \
        --num_machines 1 --mixed_precision no --dynamo_backend no "$root/scripts/accelerate_peer.py" --device cuda \
        --workload "$w" --mode single --warmup "$bench_warmup" --steps "$bench_steps"
    done
    table=$("$py" - "$out" "$bench_steps" <<'EOF'
import json, os, sys
out, steps = sys.argv[1], sys.argv[2]
def summary(path):
    try:
        lines = [l for l in open(path) if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
rows, bad = [], []
for w in ("gpt-tiny", "mlp-large"):
    h = summary(os.path.join(out, "bench-hasten-%s.json" % w))
    a = summary(os.path.join(out, "bench-accelerate-%s.json" % w))
    hs = h.get("samples_per_s") if h else None
    as_ = a.get("samples_per_s") if a else None
    if not hs:
        bad.append("hasten %s: no summary" % w)
    if not as_:
        bad.append("accelerate %s: no summary" % w)
    elif not str(a.get("device", "")).startswith("cuda"):
        bad.append("accelerate %s ran on %s" % (w, a.get("device")))
    ratio = "%.2f" % (hs / as_) if hs and as_ else "-"
    rows.append((w, str(h.get("B", "-") if h else "-"), "%.0f" % hs if hs else "-", "%.0f" % as_ if as_ else "-", ratio,
                 (a or {}).get("gpu", "-")))
head = ("workload", "batch", "hasten samples/s", "accelerate samples/s", "hasten/accelerate", "GPU")
width = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
fmt = "  ".join("%%-%ds" % n for n in width)
print("BAD " + "; ".join(bad) if bad else "OK")
print(fmt % head)
for r in rows:
    print(fmt % r)
print("(%s timed steps after 20 warm-up steps, one process, float32; accelerate: scripts/accelerate_peer.py --device cuda "
      "under accelerate launch --num_processes 1)" % steps)
EOF
)
    printf '%s\n' "$table" | tail -n +2 > "$out/bench.txt"
    status_line=$(head -n1 <<< "$table")
    [[ $status_line == BAD* ]] && bench_problems+=("${status_line#BAD }")
    tail -n +2 <<< "$table" | sed "s/^/$me: /"
    if ((${#bench_problems[@]})); then
      joined=$(printf '%s; ' "${bench_problems[@]}")
      record "h hasten vs accelerate" FAIL "${joined%; }; logs $out/bench-*.log"
    else
      record "h hasten vs accelerate" PASS "table above and in $out/bench.txt"
    fi
  fi
fi

# --- summary ----------------------------------------------------------------------------------
failed=0
for r in "${results[@]}"; do [ "$r" = PASS ] || failed=$((failed + 1)); done
{
  echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(now) - start_s)) s of ${minutes} min; torch $torch_v, CUDA $cuda_v, $gpus GPU(s))"
  for i in "${!names[@]}"; do
    printf '  %-4s %-28s %s\n' "${results[$i]}" "${names[$i]}" "${notes[$i]}"
  done
  [ -f "$out/bench.txt" ] && sed 's/^/  /' "$out/bench.txt"
  if ((failed)); then echo "gpu-check: FAIL ($failed of ${#names[@]} steps failed)"; else echo "gpu-check: PASS (all ${#names[@]} steps)"; fi
} | tee "$out/summary.txt"
# The event files are small; copy them beside the logs (the runs themselves stay in $runs).
for p in "$fm_project" "$lm_project"; do
  [ -d "$p/hasten_logs" ] && [ "$out" != "$runs" ] && mkdir -p "$out/$(basename "$p")" && cp -r "$p/hasten_logs" "$out/$(basename "$p")/" 2>/dev/null
done
((failed == 0))
