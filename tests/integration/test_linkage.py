"""What the binaries and plugins load, with no LD_LIBRARY_PATH: LibTorch from the directory it
was built with (the project's .venv by default), in the build tree and in an installed tree;
one NCCL and one CUDA runtime, those LibTorch itself loads (the wheel's nvidia/ packages, not the
toolkit's); no fmt or spdlog library (logging uses LibTorch's header-only fmt)."""
import os
import subprocess
import sys
import tempfile

import harness as h

TORCH_LIB = os.environ["HASTEN_TEST_TORCH_LIB"]
BUILD = os.path.dirname(h.BIN)
TORCH_LIBS = ("libtorch.so", "libtorch_cpu.so", "libc10.so")


def ldd(path):
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    p = subprocess.run(["ldd", path], capture_output=True, text=True, env=env, timeout=60)
    if p.returncode != 0:
        h.fail(f"ldd {path}: {p.stderr}")
    deps = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            deps[parts[0]] = parts[2]
    return deps


def runpath(path):
    p = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, timeout=60)
    for line in p.stdout.splitlines():
        if "(RUNPATH)" in line or "(RPATH)" in line:
            return line.split("[", 1)[1].rsplit("]", 1)[0]
    return None


def check(path, needs_torch):
    # Every RUNPATH entry absolute or $ORIGIN-relative: an empty one (a stray ':') or a relative
    # one searches the directory the program is run from.
    rp = runpath(path)
    if rp is not None:
        bad = [e for e in rp.split(":") if not (e.startswith("/") or e.startswith("$ORIGIN"))]
        if bad:
            h.fail(f"{path}: RUNPATH '{rp}' has entries that search the current directory: {bad}")
    deps = ldd(path)
    missing = [name for name, where in deps.items() if where == "not"]
    if missing:
        h.fail(f"{path}: not found without LD_LIBRARY_PATH: {missing}")
    real_torch_lib = os.path.realpath(TORCH_LIB)
    for lib in TORCH_LIBS:
        if lib in deps and os.path.dirname(os.path.realpath(deps[lib])) != real_torch_lib:
            h.fail(f"{path}: {lib} resolves to {deps[lib]}, not into {TORCH_LIB}")
    if needs_torch and "libtorch_cpu.so" not in deps:
        h.fail(f"{path}: does not load LibTorch at all: {sorted(deps)}")
    for name in deps:
        if name.startswith(("libfmt", "libspdlog")):
            h.fail(f"{path}: loads {name} ({deps[name]}): a second fmt beside LibTorch's")
    if "libtorch_cuda.so" in deps or "libnccl.so.2" in deps:
        for lib in ("libcudart.so.13", "libnccl.so.2"):
            if lib in deps and "/nvidia/" not in os.path.realpath(deps[lib]):
                h.fail(f"{path}: {lib} resolves to {deps[lib]}, not to the copy LibTorch loads (site-packages/nvidia)")
    return deps


def check_tree(bin_dir, lib_dir, label):
    plugins = os.path.join(lib_dir, "hasten", "plugins")
    checked = 0
    for exe in ("hasten", "hasten-example", "hasten-fashion-mnist", "hasten-char-lm"):
        path = os.path.join(bin_dir, exe)
        if not os.path.exists(path):
            h.fail(f"{label}: no {exe}")
        check(path, needs_torch=True)
        checked += 1
    check(os.path.join(lib_dir, "libhasten.so"), needs_torch=True)
    # The process each tracker runs in: bin/ in the build tree, libexec/hasten/ once installed.
    host = os.path.join(bin_dir, "hasten-tracker-host")
    if not os.path.exists(host):
        host = os.path.join(os.path.dirname(bin_dir), "libexec", "hasten", "hasten-tracker-host")
    check(host, needs_torch=True)
    nccl = None
    libraries = [os.path.join(plugins, f) for f in sorted(os.listdir(plugins)) if f.endswith(".so")]
    # gloo's implementation, which its loader opens (plugins/comm/gloo/gloo_loader.c).
    libraries += [os.path.join(plugins, "gloo", f) for f in sorted(os.listdir(os.path.join(plugins, "gloo")))]
    for path in libraries:
        f = os.path.basename(path)
        deps = check(path, needs_torch="strategy" in f or "precision" in f)
        checked += 1
        if f == "libhasten-comm-nccl.so":
            nccl = deps
    if os.path.exists(os.path.join(TORCH_LIB, "libtorch_cuda.so")):
        if nccl is None:
            h.fail(f"{label}: LibTorch has CUDA but there is no nccl comm plugin in {plugins}")
        torch_nccl = ldd(os.path.join(TORCH_LIB, "libtorch_cuda.so")).get("libnccl.so.2")
        if os.path.realpath(nccl.get("libnccl.so.2", "")) != os.path.realpath(torch_nccl or "?"):
            h.fail(f"{label}: the nccl plugin loads {nccl.get('libnccl.so.2')}, LibTorch {torch_nccl}: two NCCLs")
    print(f"{label}: {checked} binaries and plugins resolve LibTorch in {TORCH_LIB}")


def main():
    check_tree(h.BIN, os.path.join(BUILD, "lib"), "build tree")
    with tempfile.TemporaryDirectory() as prefix:
        h.run(["cmake", "--install", BUILD, "--prefix", prefix], check=True, timeout=300)
        check_tree(os.path.join(prefix, "bin"), os.path.join(prefix, "lib"), "installed tree")


if __name__ == "__main__":
    main()
