"""The parity and sharded tests under every OpenBLAS kernel family this CPU runs (label slow:
`ctest -L slow`, or `make test-slow`). Kernels block products differently and so round
differently; the tests compare like with like (docs/strategies.md, "What equal means") and must
hold under each. A kernel is tried only where the CPU has its instructions, and a run counts
only if OpenBLAS really took it (`hasten env` names the kernel in use)."""
import os
import re
import subprocess
import sys
import time

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = ["test_parity_single.py", "test_ddp_parity.py", "test_sharded.py"]
# OpenBLAS 0.3.21's x86-64 families, oldest first, with the instructions each needs.
KERNELS = [
    ("Prescott", {"pni"}),
    ("Nehalem", {"pni", "ssse3", "sse4_2"}),
    ("Sandybridge", {"avx"}),
    ("Haswell", {"avx2", "fma"}),
    ("Zen", {"avx2", "fma"}),
    ("SkylakeX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
    ("Cooperlake", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}),
]


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def kernel_in_use(env):
    p = h.run(h.hasten("env"), env=env, timeout=60)
    m = re.search(r"openblas \(core (\w+)", p.stdout)
    return m.group(1) if m else None


flags = cpu_flags()
runnable = [k for k, need in KERNELS if need <= flags]
if not runnable:
    print("parity kernels: this CPU runs none of OpenBLAS's x86-64 families (or the BLAS is not OpenBLAS)")
    sys.exit(77)
print("kernels this CPU runs:", ", ".join(runnable))
failures, ran = [], []
for kernel in runnable:
    env = dict(os.environ, OPENBLAS_CORETYPE=kernel)
    used = kernel_in_use(env)
    if used is None:
        print("parity kernels: the BLAS is not OpenBLAS; nothing to vary")
        sys.exit(77)
    if used.lower() != kernel.lower():
        print(f"{kernel}: OpenBLAS runs {used} instead; skipped")
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
    h.fail("no kernel could be forced with OPENBLAS_CORETYPE")
print(f"parity kernels: OK under {', '.join(ran)}")
