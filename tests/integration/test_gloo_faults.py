"""The gloo comm plugin fails cleanly: a hostname option that does not resolve, or resolves to
no address of this machine, is an error naming it on every rank (Gloo itself segfaults on
the first); ranks that enter different collectives (one rank stops early and reduces another
tensor) end in an error naming the rank and the operation, never an abort."""
import os

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-worker")
CRASH_TEXT = ("terminate called", "Aborted", "Segmentation fault", "core dumped", "signal")


def launch(worker_args, env):
    p = h.run(h.hasten("launch", "--num_processes", "2", WORKER, *worker_args),
              env={"HASTEN_COMM": "gloo", **env}, timeout=120)
    return p


def clean_failure(p, what):
    if p.returncode == 0 or p.returncode < 0 or p.returncode >= 128:
        h.fail(f"{what}: exit status {p.returncode}, expected a clean failure\n{p.stderr}")
    for bad in CRASH_TEXT:
        if bad in p.stderr:
            h.fail(f"{what}: output contains '{bad}'\n{p.stderr}")


for name, expect in (("no-such-host.invalid", "does not resolve"),
                     ("192.0.2.1", "resolves to no address of this machine")):
    p = launch(["--steps", "2"], {"HASTEN_COMM_OPTIONS": "{hostname: %s}" % name})
    clean_failure(p, f"hostname {name}")
    if f"comm_options.hostname '{name}'" not in p.stderr or expect not in p.stderr:
        h.fail(f"hostname {name}: the error does not name it and say '{expect}':\n{p.stderr}")
    print(f"ok: hostname {name}: {[l for l in p.stderr.splitlines() if expect in l][0]}")

p = launch(["--steps", "40", "--short-rank", "1"], {"HASTEN_TIMEOUT_S": "5"})
clean_failure(p, "ranks in different collectives")
if "gloo: rank" not in p.stderr or "allreduce" not in p.stderr:
    h.fail(f"ranks in different collectives: the error does not name the rank and the operation:\n{p.stderr}")
print("ok: ranks in different collectives: " + [l for l in p.stderr.splitlines() if "gloo: rank" in l][0])
print("gloo faults: OK")
