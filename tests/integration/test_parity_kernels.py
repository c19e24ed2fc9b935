"""The parity and sharded tests under every CPU kernel family this machine runs (label slow:
`ctest -L slow`, or `make test-slow`). Kernels block and vectorise products differently and so
round differently; the tests compare like with like (docs/strategies.md, "What equal means")
and must hold under each. A family is tried only where the CPU has its instructions, and a run
counts only if the library really took it.

- MKL (PyTorch's wheels, linked into libtorch_cpu): each family is ATen's CPU capability
  (ATEN_CPU_CAPABILITY: default, avx2, avx512) with MKL held to the same instruction set
  (MKL_ENABLE_INSTRUCTIONS); the venv's torch, the same libtorch_cpu, reports the capability
  taken under that environment.
- OpenBLAS (a LibTorch built against it): OPENBLAS_CORETYPE, checked with `hasten env`."""
import os
import re
import subprocess
import sys
import time

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = ["test_parity_single.py", "test_ddp_parity.py", "test_sharded.py"]
# OpenBLAS 0.3.21's x86-64 families, oldest first, with the instructions each needs.
OPENBLAS_KERNELS = [
    ("Prescott", {"pni"}),
    ("Nehalem", {"pni", "ssse3", "sse4_2"}),
    ("Sandybridge", {"avx"}),
    ("Haswell", {"avx2", "fma"}),
    ("Zen", {"avx2", "fma"}),
    ("SkylakeX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
    ("Cooperlake", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}),
]
# ATen's CPU capabilities with the MKL instruction set of the same generation.
MKL_KERNELS = [
    ("default", "SSE4_2", {"sse4_2"}),
    ("avx2", "AVX2", {"avx2", "fma"}),
    ("avx512", "AVX512", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
]


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def blas_line():
    p = h.run(h.hasten("env"), timeout=60)
    m = re.search(r"^BLAS:\s+(.*)$", p.stdout, re.M)
    return m.group(1) if m else ""


def openblas_kernel_in_use(env):
    p = h.run(h.hasten("env"), env=env, timeout=60)
    m = re.search(r"openblas \(core (\w+)", p.stdout)
    return m.group(1) if m else None


def aten_capability_in_use(env):
    p = h.run([h.PYTHON, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"], env=env, timeout=120)
    return p.stdout.strip().lower() if p.returncode == 0 else None


flags = cpu_flags()
blas = blas_line()
if blas.startswith("mkl"):
    families = [(name, dict(os.environ, ATEN_CPU_CAPABILITY=name, MKL_ENABLE_INSTRUCTIONS=mkl))
                for name, mkl, need in MKL_KERNELS if need <= flags]
    taken = lambda name, env: aten_capability_in_use(env) == name  # noqa: E731
    how = "ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS"
elif blas.startswith("openblas"):
    families = [(name, dict(os.environ, OPENBLAS_CORETYPE=name)) for name, need in OPENBLAS_KERNELS if need <= flags]
    taken = lambda name, env: (openblas_kernel_in_use(env) or "").lower() == name.lower()  # noqa: E731
    how = "OPENBLAS_CORETYPE"
else:
    print(f"parity kernels: the BLAS is '{blas}', neither MKL nor OpenBLAS: nothing to vary")
    sys.exit(77)
if not families:
    print(f"parity kernels: this CPU runs none of the kernel families of {blas}")
    sys.exit(77)
print(f"BLAS {blas}; kernel families this CPU runs: " + ", ".join(name for name, _ in families))
failures, ran = [], []
for kernel, env in families:
    if not taken(kernel, env):
        print(f"{kernel}: not taken under {how}; skipped")
        continue
    ran.append(kernel)
    for test in TESTS:
        t0 = time.monotonic()
        p = subprocess.run([h.PYTHON, os.path.join(HERE, test)], env=env, capture_output=True, text=True, timeout=1800)
        took = time.monotonic() - t0
        figures = [l for l in p.stdout.splitlines() if "max |diff|" in l]
        status = "ok" if p.returncode == 0 else f"FAILED ({p.returncode})"
        print(f"{kernel:11s} {test:24s} {status} in {took:.0f} s" + "".join(f"\n    {l}" for l in figures))
        if p.returncode != 0:
            failures.append(f"{kernel} {test}: " + (p.stderr.strip().splitlines() or ["no message"])[-1])
if failures:
    h.fail("under some kernels:\n  " + "\n  ".join(failures))
if not ran:
    h.fail(f"no kernel family could be forced with {how}")
print(f"parity kernels: OK under {', '.join(ran)}")
