"""hasten launch with several workers: a failing worker stops the run quickly and names its
rank, a hung worker turns into a timeout on the others, a rank that never joins is named by
the rendezvous, signals reach every worker, nothing is left behind, per-rank logs, ports."""
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-worker")


def leftovers(tag):
    out = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    return [p for p in out if int(p) != os.getpid()]


def launch(args, worker_args, env=None, timeout=120):
    tag = "t" + uuid.uuid4().hex[:12]
    cmd = h.hasten("launch", "--num_processes", "2", *args, WORKER, *worker_args, "--tag", tag)
    start = time.monotonic()
    p = h.run(cmd, env=env, timeout=timeout)
    elapsed = time.monotonic() - start
    time.sleep(0.5)
    left = leftovers(tag)
    if left:
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)
        h.fail(f"processes left behind after {' '.join(cmd)}: {left}")
    return p, elapsed


with tempfile.TemporaryDirectory() as d:
    env = {"HASTEN_HOME": os.path.join(d, "home")}

    # A worker that exits 3 at step 5.
    p, t = launch(["--grace_period", "3"], ["--steps", "100000", "--fail-rank", "1", "--fail-step", "5",
                                            "--exit-code", "3"], env)
    if p.returncode != 3:
        h.fail(f"launcher exited {p.returncode}, expected the worker's 3\n{p.stderr}")
    if "hasten launch: rank 1 (pid " not in p.stderr or "exited with status 3" not in p.stderr:
        h.fail("the launcher did not name rank 1, its pid and its status:\n" + p.stderr)
    if t > 10:
        h.fail(f"the launcher took {t:.1f} s to stop after a worker failed")
    print(f"ok: failing worker: exit 3 in {t:.1f} s")

    # A worker that hangs inside the training loop: its peer's collective times out.
    p, t = launch([], ["--steps", "100000", "--hang-rank", "1", "--hang-step", "3"], {**env, "HASTEN_TIMEOUT_S": "4"})
    if p.returncode == 0 or "timed out" not in p.stderr:
        h.fail(f"a hung peer did not become a timeout error (exit {p.returncode}):\n{p.stderr}")
    if t > 4 + 10:
        h.fail(f"the timeout took {t:.1f} s (configured 4 s)")
    print(f"ok: hung worker: timeout error in {t:.1f} s")

    # A rank that never joins the rendezvous.
    p, t = launch([], ["--steps", "1", "--late-rank", "1", "--late-s", "60"], {**env, "HASTEN_TIMEOUT_S": "3"})
    if p.returncode == 0 or "rank 1 of 2 never joined" not in p.stderr:
        h.fail(f"the rendezvous did not name the missing rank (exit {p.returncode}):\n{p.stderr}")
    if t > 3 + 10:
        h.fail(f"the rendezvous timeout took {t:.1f} s (configured 3 s)")
    print(f"ok: missing rank named in {t:.1f} s")

    # SIGINT to the launcher reaches every worker; none is left.
    tag = "t" + uuid.uuid4().hex[:12]
    proc = subprocess.Popen(h.hasten("launch", "--num_processes", "2", WORKER, "--steps", "100000", "--tag", tag),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        h.fail("the launcher did not stop within 15 s of SIGINT")
    time.sleep(0.5)
    if leftovers(tag):
        h.fail(f"workers left after SIGINT: {leftovers(tag)}")
    if proc.returncode == 0:
        h.fail("the launcher exited 0 after SIGINT")
    print(f"ok: SIGINT stops every worker (exit {proc.returncode})")

    # SIGKILL of the launcher (no chance to forward anything): the workers die with it.
    tag = "t" + uuid.uuid4().hex[:12]
    proc = subprocess.Popen(h.hasten("launch", "--num_processes", "2", WORKER, "--steps", "100000", "--tag", tag),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
    deadline = time.monotonic() + 30
    while len(leftovers(tag)) < 3 and time.monotonic() < deadline:  # the launcher and both workers
        time.sleep(0.1)
    if len(leftovers(tag)) < 3:
        proc.kill()
        h.fail(f"the launcher and its two workers did not start: {leftovers(tag)}")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while leftovers(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = leftovers(tag)
    if left:
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)
        h.fail(f"workers outlived a launcher killed with SIGKILL: {left}")
    print("ok: SIGKILL of the launcher takes its workers with it")

    # Per-rank logs, and output prefixed with the rank.
    logs = os.path.join(d, "logs")
    p, _ = launch(["--tee", "3", "--log_dir", logs], ["--steps", "3"], {**env, "HASTEN_LOG_LEVEL": "debug"})
    if p.returncode != 0 or "[rank 0] done 3 steps" not in p.stdout:
        h.fail(f"a clean run failed or lost its prefix (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
    # hasten's own log lines name the rank once: the launcher's prefix, not the logger's too.
    log_lines = [line for line in p.stderr.splitlines() if "[hasten]" in line]
    if not any(line.startswith("[rank ") for line in log_lines):
        h.fail("no worker's hasten log line at HASTEN_LOG_LEVEL=debug:\n" + p.stderr)
    # A worker's line starts with the launcher's "[rank r] " and names no other rank; the
    # launcher's own lines (its plugin check at debug level) name none.
    twice = [line for line in log_lines if line.count("[rank ") != (1 if line.startswith("[rank ") else 0)]
    if twice:
        h.fail("log lines that do not name the rank exactly once:\n" + "\n".join(twice[:5]))
    with open(os.path.join(logs, "rank_0.log")) as f:
        if "done 3 steps" not in f.read():
            h.fail("rank_0.log does not hold rank 0's output")
    if not os.path.exists(os.path.join(logs, "rank_1.log")):
        h.fail("no rank_1.log")
    print("ok: --tee writes per-rank logs")

    # Port 0 and a busy port both end up on a free port.
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    p, _ = launch(["--main_process_port", str(port)], ["--steps", "2"], env)
    busy.close()
    if p.returncode != 0 or f"port {port} is busy" not in p.stderr:
        h.fail(f"a busy port was not replaced (exit {p.returncode}):\n{p.stderr}")
    p, _ = launch(["--main_process_port", "0"], ["--steps", "2"], env)
    if p.returncode != 0:
        h.fail(f"port 0 failed:\n{p.stderr}")
    print("ok: port 0 and busy ports")
print("launcher: OK")
