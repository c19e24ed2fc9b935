"""Configure's word on what it builds: one line naming the LibTorch and whether the CUDA paths
and the nccl plugin are built; HASTEN_CUDA=OFF builds for the CPU only and says so; a bad
HASTEN_CUDA value is refused in one line. (The CUDA build itself is the suite's own build.)"""
import os
import re
import tempfile

import harness as h

SOURCE = os.environ["HASTEN_TEST_SOURCE_DIR"]
BUILD = os.path.dirname(h.BIN)


def configure(*args):
    with tempfile.TemporaryDirectory() as d:
        p = h.run(["cmake", "-S", SOURCE, "-B", d, "-G", "Ninja", "-DHASTEN_BUILD_TESTS=OFF",
                   "-DHASTEN_BUILD_APPS=OFF", f"-DHASTEN_PYTHON={h.PYTHON}", *args], timeout=300)
        ninja = ""
        if os.path.exists(os.path.join(d, "build.ninja")):
            with open(os.path.join(d, "build.ninja")) as f:
                ninja = f.read()
        return p, ninja


# The suite's own build: the line is in its cache-independent output, so configure it again.
p, ninja = configure()
if p.returncode != 0:
    h.fail(f"configure failed:\n{p.stderr[-3000:]}")
lines = [l for l in p.stderr.splitlines() if l.startswith("hasten: LibTorch ")]
if len(lines) != 1:
    h.fail(f"expected one 'hasten: LibTorch ...' line, got {lines}\n{p.stderr[-2000:]}")
line = lines[0]
cuda = os.path.exists(os.path.join(os.environ["HASTEN_TEST_TORCH_LIB"], "libtorch_cuda.so"))
if cuda:
    if not re.search(r"with CUDA: building the CUDA paths and the nccl comm plugin against NCCL \d+\.\d+\.\d+ \(.*libnccl", line):
        h.fail(f"a CUDA LibTorch, but the line says: {line}")
    if "libhasten-comm-nccl.so" not in ninja:
        h.fail("a CUDA LibTorch, but the nccl plugin is not built")
else:
    if "has no CUDA: CPU only, no nccl plugin" not in line:
        h.fail(f"a CPU LibTorch, but the line says: {line}")
print("default:", line)

p, ninja = configure("-DHASTEN_CUDA=OFF")
line = [l for l in p.stderr.splitlines() if l.startswith("hasten: LibTorch ")]
if p.returncode != 0 or not line or "CPU only (HASTEN_CUDA=OFF), no nccl plugin" not in line[0]:
    h.fail(f"HASTEN_CUDA=OFF: {p.returncode} {line}\n{p.stderr[-2000:]}")
if "libhasten-comm-nccl.so" in ninja:
    h.fail("HASTEN_CUDA=OFF still builds the nccl plugin")
print("HASTEN_CUDA=OFF:", line[0])

p, _ = configure("-DHASTEN_CUDA=maybe")
if p.returncode == 0 or "HASTEN_CUDA='maybe' is not allowed (allowed: AUTO, ON, OFF)" not in p.stderr:
    h.fail(f"HASTEN_CUDA=maybe was not refused in one line:\n{p.stderr[-2000:]}")
print("HASTEN_CUDA=maybe: refused")

p, _ = configure("-DTorch_DIR=/nonexistent/torch", "-DHASTEN_PYTHON=/nonexistent/python")
if p.returncode == 0:
    h.fail("a Torch_DIR with no LibTorch configured")
print("configure: OK")
