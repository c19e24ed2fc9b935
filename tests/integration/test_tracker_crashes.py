"""Trackers run isolated from the training process: a tracker plugin that segfaults or aborts
in create, start, log or destroy (tests/plugins/crash_tracker.c) is reported in one warning
naming it, the signal and the call, the program runs to its end and exits 0, and the jsonl
tracker beside it records every step (NaN and inf read back by Python's json module as the same
floats) and a clean end. hasten-example trains to its last step with the crashing tracker and
csv. With trackers_in_process: true the tracker really is in the process: its crash kills it."""
import csv
import glob
import json
import math
import os
import signal
import tempfile

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")
CRASH = os.path.join(os.path.dirname(h.BIN), "tests", "plugins", "crashing", "libhasten-tracker-crash.so")
SIGNALS = {"segv": "SIGSEGV", "abort": "SIGABRT"}
CALLS = {"create": "create", "start": "start", "log": "log_scalars", "destroy": "destroy"}


def warnings(p):
    # Not the once-per-run note that a tracker keeps no text (the worker logs text to all).
    return [l for l in p.stderr.splitlines() if "warn" in l.lower() and "keeps no text" not in l]


def jsonl_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def check_jsonl(path, what):
    records = jsonl_records(path)
    metrics = [r for r in records if r["type"] == "metrics"]
    if [r["step"] for r in metrics] != [1, 2, 3, 4, 5]:
        h.fail(f"{what}: jsonl has steps {[r['step'] for r in metrics]}, expected 1..5")
    # tracker_run.cpp: step 3's loss is NaN, step 4's acc is +inf; json.loads reads them back.
    if not math.isnan(metrics[2]["loss"]) or metrics[3]["acc"] != math.inf or metrics[4]["loss"] != 0.2:
        h.fail(f"{what}: non-finite values did not survive: {metrics}")
    if records[-1] != {**records[-1], "type": "end", "status": "ok"}:
        h.fail(f"{what}: jsonl does not end with a clean end record: {records[-1]}")


with tempfile.TemporaryDirectory() as d:
    for at, call in CALLS.items():
        for how, sig in SIGNALS.items():
            what = f"crash in {at} ({how})"
            logs = os.path.join(d, f"{at}-{how}")
            env = {"HASTEN_LOG_WITH": f"{CRASH},jsonl", "HASTEN_LOGGING_DIR": logs,
                   "HASTEN_TRACKER_OPTIONS": json.dumps({"crash": {"at": at, "how": how}})}
            p = h.run([WORKER], env=env)
            if p.returncode != 0 or "trackers: done" not in p.stdout:
                h.fail(f"{what}: exited {p.returncode}\n{p.stdout}\n{p.stderr}")
            w = warnings(p)
            if len(w) != 1 or "'crash'" not in w[0] or sig not in w[0] or f" in {call}" not in w[0]:
                h.fail(f"{what}: expected one warning naming 'crash', {sig} and '{call}', got:\n{p.stderr}")
            check_jsonl(os.path.join(logs, "trk", "metrics.jsonl"), what)
            if at == "log":
                with open(os.path.join(logs, "trk", "crash.out")) as f:
                    if f.read().split() != ["1", "2"]:
                        h.fail(f"{what}: the tracker did not record its first two steps before crashing")
            print(f"ok: {what}: {w[0]}")

    # A whole training run: the crash at the third log call is reported, csv has every step.
    project_dir = os.path.join(d, "example")
    p = h.run(h.example("--workload", "mlp-small", "--steps", "12", "--warmup", "0", "--log-every", "2",
                        "--log_with", f"{CRASH},csv", "--project_dir", project_dir,
                        "--set", "tracker_options={crash: {at: log, how: segv}}"))
    if p.returncode != 0:
        h.fail(f"hasten-example with a crashing tracker: exited {p.returncode}\n{p.stderr}")
    w = warnings(p)
    if len(w) != 1 or "'crash'" not in w[0] or "SIGSEGV" not in w[0]:
        h.fail(f"hasten-example with a crashing tracker: expected one warning, got:\n{p.stderr}")
    (metrics_csv,) = glob.glob(os.path.join(project_dir, "hasten_logs", "hasten-example", "metrics*.csv"))
    with open(metrics_csv) as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r["loss"]]  # rows of the loop's log calls
    if steps != [2, 4, 6, 8, 10, 12]:
        h.fail(f"hasten-example with a crashing tracker: csv steps {steps}, expected 2..12 by 2")

    # In-process on request: the same healthy run, and a crash that is the process's own.
    logs = os.path.join(d, "in-process")
    p = h.run([WORKER], env={"HASTEN_LOG_WITH": "jsonl", "HASTEN_LOGGING_DIR": logs,
                             "HASTEN_TRACKERS_IN_PROCESS": "true"})
    if p.returncode != 0 or warnings(p):
        h.fail(f"trackers_in_process: exited {p.returncode}\n{p.stderr}")
    check_jsonl(os.path.join(logs, "trk", "metrics.jsonl"), "trackers_in_process")
    p = h.run([WORKER], env={"HASTEN_LOG_WITH": f"{CRASH},jsonl", "HASTEN_LOGGING_DIR": logs,
                             "HASTEN_TRACKERS_IN_PROCESS": "true",
                             "HASTEN_TRACKER_OPTIONS": json.dumps({"crash": {"at": "log", "how": "segv"}})})
    if p.returncode != -signal.SIGSEGV:
        h.fail(f"trackers_in_process with a crashing tracker: expected death by SIGSEGV, got {p.returncode}")
print("tracker crashes: OK")
