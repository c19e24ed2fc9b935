"""hasten-bench --max-model under a small budget: for ddp2 and zero3 (and the PyTorch peer) the
search reports a model that fits, every trial that fitted is smaller than every trial that did
not (the search is consistent with a monotone memory), parameter counts grow with the size,
every fitting trial's summed peak stays within the budget, and zero3 fits a model at least as
large as ddp2's. --start-size above the answer finds it too (the largest size that fitted, the
next one over; within one size of the search from 1, whose edge may sit within a MiB). Killed
with SIGTERM, the search takes its running trial's whole process group with it. Bad budgets,
sides, start sizes and a missing interpreter (HASTEN_BENCH_PYTHON) are one clear line."""
import json
import os
import signal
import subprocess
import tempfile
import time

import harness as h

BENCH = os.path.join(h.BIN, "hasten-bench")
PEER = os.path.join(h.PEER_DIR, "torch_peer.py")
# The torch-ddp2 side's interpreter, named explicitly: this test's own (the project's .venv),
# not whatever python3 PATH holds. hasten-bench reads it from HASTEN_BENCH_PYTHON (or --python).
PEER_ENV = {"HASTEN_BENCH_PYTHON": h.PYTHON}


def search(*args):
    p = h.run([BENCH, "--max-model", *args], timeout=580, check=True, env=PEER_ENV)
    records = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return ([r for r in records if r["bench"] == "max_model_trial"],
            {r["side"]: r for r in records if r["bench"] == "max_model"}, p.stdout)


# The budget: what two processes of the smallest model take on this machine (the runtime:
# libraries, allocator), plus 100 MiB for the models, so that a few sizes fit and some do not.
first, _, _ = search("--budget-mib", "4096", "--sides", "ddp2", "--max-size", "1")
BUDGET_MIB = round(first[0]["peak_rss_mib_sum"] + 100)
trials, results, out = search("--budget-mib", str(BUDGET_MIB), "--sides", "ddp2", "zero3", "--max-size", "24")
# The PyTorch side at size 1 only (a Python process with torch is slow to start, and larger):
# its parameter count must be hasten's.
peer_trials, peer_results, peer_out = search("--budget-mib", "4096", "--sides", "torch-ddp2", "--max-size", "1",
                                             "--peer", PEER)
trials += peer_trials
results.update(peer_results)
if sorted(results) != ["ddp2", "torch-ddp2", "zero3"]:
    h.fail(f"expected a result for ddp2, zero3 and torch-ddp2, got {sorted(results)}\n{out}\n{peer_out}")
for side, result in results.items():
    mine = [t for t in trials if t["side"] == side]
    fit = [t["size"] for t in mine if t["fits"]]
    miss = [t["size"] for t in mine if not t["fits"]]
    print(f"{side}: fits {sorted(fit)}, does not fit {sorted(miss)}; answer size {result['size']}, "
          f"{result['params']} parameters, {result['peak_rss_mib_sum']:.0f} MiB")
    if result["size"] < 1 or result["params"] <= 0:
        h.fail(f"{side}: no model fits in {result['budget_mib']} MiB: {result}")
    if not fit or max(fit) != result["size"]:
        h.fail(f"{side}: the answer {result['size']} is not the largest size that fitted ({max(fit)})")
    if miss and max(fit) >= min(miss):
        h.fail(f"{side}: size {max(fit)} fitted but the smaller {min(miss)} did not: not monotone")
    if not miss and result["size"] != (1 if side == "torch-ddp2" else 24):
        h.fail(f"{side}: no size failed, yet the search stopped at {result['size']} below --max-size")
    for t in mine:
        if t["fits"] and not (0 < t["peak_rss_mib_sum"] <= t["budget_mib"]):
            h.fail(f"{side}: size {t['size']} fitted with a summed peak of {t['peak_rss_mib_sum']} MiB")
        if t["killed"] and t["fits"]:
            h.fail(f"{side}: size {t['size']} was killed over the budget yet fits")
    sized = sorted((t["size"], t["params"]) for t in mine if t["params"] > 0)
    if any(a[1] >= b[1] for a, b in zip(sized, sized[1:])):
        h.fail(f"{side}: parameter counts do not grow with the size: {sized}")
if results["zero3"]["params"] < results["ddp2"]["params"]:
    h.fail(f"zero3 fits fewer parameters ({results['zero3']['params']}) than ddp2 ({results['ddp2']['params']})")
# The same shape gives the same parameter count in hasten and in the PyTorch peer.
by_size = {}
for t in trials:
    if t["params"] > 0:
        by_size.setdefault(t["size"], set()).add(t["params"])
for size, counts in by_size.items():
    if len(counts) != 1:
        h.fail(f"size {size}: the sides count different parameters: {counts}")

# --start-size above the answer halves down to it, then bisects to the answer from 1
# (one start only: every trial is a launch, and the doubling is the path the search above took).
for start in (results["ddp2"]["size"] + 3,):
    s_trials, s_results, s_out = search("--budget-mib", str(BUDGET_MIB), "--sides", "ddp2", "--max-size", "24",
                                        "--start-size", str(start))
    if s_trials[0]["size"] != start:
        h.fail(f"--start-size {start}: the first trial was size {s_trials[0]['size']}\n{s_out}")
    # The search's own trials decide its answer: the largest size that fitted, with the next
    # size tried and over the budget. Against the search from 1 it may differ by one size: a
    # size whose peak lies within a MiB of the budget fits in one launch and not in another.
    answer = s_results["ddp2"]["size"]
    fitted = [t["size"] for t in s_trials if t["fits"]]
    over = [t["size"] for t in s_trials if not t["fits"]]
    if not fitted or max(fitted) != answer or (answer < 24 and answer + 1 not in over):
        h.fail(f"--start-size {start}: answer {answer}, but it fitted {sorted(fitted)} and not {sorted(over)}\n{s_out}")
    if abs(answer - results["ddp2"]["size"]) > 1:
        h.fail(f"--start-size {start}: answer {answer}, from size 1: {results['ddp2']['size']}\n{s_out}")
    print(f"--start-size {start}: sizes tried {[t['size'] for t in s_trials]}, answer {s_results['ddp2']['size']}")


def gone(pid):
    """True once pid has exited (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# SIGTERM during a trial: the trial (here a stand-in peer that sleeps, with a child of its own,
# both in the trial's process group) must end with the search.
with tempfile.TemporaryDirectory() as tmp:
    pid_file = os.path.join(tmp, "pids")
    sleeper = os.path.join(tmp, "sleeping_peer.py")
    with open(sleeper, "w") as f:
        f.write(f"""import os, time
child = os.fork()
if child == 0:
    time.sleep(300)
    os._exit(0)
with open({pid_file!r} + ".part", "w") as f:
    f.write(f"{{os.getpid()}} {{child}}")
os.rename({pid_file!r} + ".part", {pid_file!r})
time.sleep(300)
""")
    search_p = subprocess.Popen([BENCH, "--max-model", "--sides", "torch-ddp2", "--max-size", "1", "--peer", sleeper],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, **PEER_ENV))
    deadline = time.monotonic() + 120
    while not os.path.exists(pid_file):
        if search_p.poll() is not None or time.monotonic() > deadline:
            search_p.kill()
            h.fail(f"the stand-in trial never started (search exit {search_p.poll()})")
        time.sleep(0.05)
    with open(pid_file) as f:
        trial_pids = [int(x) for x in f.read().split()]
    search_p.send_signal(signal.SIGTERM)
    rc = search_p.wait(timeout=60)
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in trial_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in trial_pids if not gone(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    if alive:
        h.fail(f"SIGTERM to hasten-bench --max-model left its trial's processes {alive} running")
    if rc != -signal.SIGTERM:
        h.fail(f"hasten-bench --max-model ended with {rc} after SIGTERM, expected to die of SIGTERM")
    print(f"SIGTERM: the search died of it and took the trial's processes {trial_pids} with it")

h.check_clean_failure(h.run([BENCH, "--max-model", "--start-size", "5", "--max-size", "4"]), "--start-size 5 > --max-size 4",
                      "--start-size")
h.check_clean_failure(h.run([BENCH, "--max-model", "--budget-mib", "1"]), "--budget-mib 1", "--budget-mib")
h.check_clean_failure(h.run([BENCH, "--max-model", "--sides", "ddp3"]), "--sides ddp3", "--sides")
h.check_clean_failure(h.run([BENCH, "--max-model", "--sides", "torch-ddp2", "--max-size", "1"],
                            env={"HASTEN_BENCH_PYTHON": "/nonexistent/python"}),
                      "HASTEN_BENCH_PYTHON=/nonexistent/python", "HASTEN_BENCH_PYTHON")
print("bench_max_model: OK")
