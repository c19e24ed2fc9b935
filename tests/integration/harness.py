"""Helpers for the integration tests: where the binaries and the PyTorch peer are, running
commands with a deadline, and the checks every command-line error must pass."""
import json
import os
import subprocess
import sys
import tempfile

BIN = os.environ["HASTEN_TEST_BIN_DIR"]
PEER_DIR = os.environ["HASTEN_TEST_PEER_DIR"]
# The project's interpreter (.venv): ctest passes it as HASTEN_TEST_PYTHON and runs the tests on
# it, so sys.executable is the same one where the variable is not set.
PYTHON = os.environ.get("HASTEN_TEST_PYTHON") or sys.executable


def _pin_openblas_kernel():
    """Where OpenBLAS does not recognise the CPU, hasten launch gives its workers a better
    kernel than a process started directly gets; kernels round differently, so every command of
    a test (launched, direct, the peer) runs with the kernel hasten launch would choose."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        p = subprocess.run([os.path.join(BIN, "hasten-bench"), "--print-blas-env"], capture_output=True,
                           text=True, timeout=60)
    except OSError:
        return
    for line in p.stdout.splitlines():
        if line.startswith("OPENBLAS_CORETYPE="):
            os.environ["OPENBLAS_CORETYPE"] = line.split("=", 1)[1]


_pin_openblas_kernel()


def hasten(*args):
    return [os.path.join(BIN, "hasten"), *args]


def example(*args):
    return [os.path.join(BIN, "hasten-example"), *args]


def peer(*args):
    """torch_peer.py with the AdamW arithmetic of LibTorch's C++ optimizer, which hasten-example
    trains with (peer_workloads.LibTorchAdamW says why)."""
    return [PYTHON, os.path.join(PEER_DIR, "torch_peer.py"), "--optimizer", "libtorch", *args]


def run(cmd, timeout=300, env=None, check=False, cwd=None):
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    if check and p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def losses(cmd, env=None):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "losses.json")
        run(cmd + ["--losses-out", out], env=env, check=True)
        with open(out) as f:
            return json.load(f)["losses"]


class Run:
    """One training run's losses and, with --trace-out, rank 0's gradients after every
    backward and parameters after every optimizer call (numpy arrays, a row per micro-batch)."""

    def __init__(self, losses, grads, params):
        self.losses, self.grads, self.params = losses, grads, params


def traced(cmd, env=None, timeout=300):
    """Runs a hasten-example or torch_peer.py command with --losses-out and --trace-out."""
    import numpy as np
    with tempfile.TemporaryDirectory() as d:
        out, prefix = os.path.join(d, "losses.json"), os.path.join(d, "trace")
        run(cmd + ["--losses-out", out, "--trace-out", prefix], env=env, check=True, timeout=timeout)
        with open(out) as f:
            losses = json.load(f)["losses"]

        def rows(kind):
            path = f"{prefix}.{kind}.f32"
            if not os.path.exists(path):
                return None
            flat = np.fromfile(path, dtype=np.float32)
            if flat.size % len(losses):
                fail(f"{path}: {flat.size} floats are not {len(losses)} records")
            return flat.reshape(len(losses), -1)
        return Run(losses, rows("grads"), rows("params"))


def first_difference(a, b):
    """(row, index, |difference|) of the first element where two traces differ, or None."""
    import numpy as np
    if a.shape != b.shape:
        fail(f"traces differ in shape: {a.shape} vs {b.shape}")
    rows = np.nonzero((a != b).any(axis=1))[0]
    if rows.size == 0:
        return None
    r = int(rows[0])
    i = int(np.nonzero(a[r] != b[r])[0][0])
    return r, i, float(abs(a[r][i] - b[r][i]))


def check_bitwise(what, a, b):
    """Losses, gradients (where both runs traced them) and parameters equal to the last bit."""
    if len(a.losses) != len(b.losses):
        fail(f"{what}: {len(a.losses)} losses against {len(b.losses)}")
    for i, (x, y) in enumerate(zip(a.losses, b.losses)):
        if x != y:
            fail(f"{what}: the losses part at micro-batch {i}: {x!r} vs {y!r}")
    for kind in ("grads", "params"):
        x, y = getattr(a, kind), getattr(b, kind)
        if x is None or y is None:
            continue
        d = first_difference(x, y)
        if d is not None:
            fail(f"{what}: the {kind} part after micro-batch {d[0]}, element {d[1]} (|diff| {d[2]:.3g}); "
                 f"{int((x != y).sum())} of {x.size} values differ over the run")
    traced = " and ".join(k for k in ("grads", "params") if getattr(a, k) is not None and getattr(b, k) is not None)
    print(f"{what}: bitwise equal ({len(a.losses)} losses" + (f", {traced} after every micro-batch)" if traced else ")"))


def max_abs_diff(a, b):
    if len(a) != len(b):
        fail(f"loss lists differ in length: {len(a)} vs {len(b)}")
    return max(abs(x - y) for x, y in zip(a, b))


def check_clean_failure(p, what, expect=None):
    """A bad input: non-zero exit (not a signal), one clear error line, no crash text."""
    problems = []
    if p.returncode == 0:
        problems.append("exited 0")
    if p.returncode < 0 or p.returncode >= 128:
        problems.append(f"died with status {p.returncode} (a signal)")
    for bad in ("terminate called", "Aborted", "Segmentation fault", "core dumped", "what():"):
        if bad in p.stderr or bad in p.stdout:
            problems.append(f"output contains '{bad}'")
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if len(lines) != 1:
        problems.append(f"stderr has {len(lines)} lines, expected exactly one")
    elif "error" not in lines[0]:
        problems.append("the line does not say 'error'")
    if expect and expect not in p.stderr:
        problems.append(f"stderr does not mention '{expect}'")
    if problems:
        fail(f"{what}: " + "; ".join(problems) + f"\nstderr:\n{p.stderr}\nstdout:\n{p.stdout}")
    print(f"ok: {what}: {lines[0]}")


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)
