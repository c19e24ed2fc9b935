"""Trackers from the command line and when they fail: hasten-example --log_with with all four
trackers writes each one's files; a logging directory that cannot be created, or one
tracker's own directory, gives one warning naming the tracker and the path while training runs
to its last step; --log_with and --trackers naming different trackers is one clear error;
log_with all starts every installed tracker; under hasten launch only the main process writes."""
import glob
import json
import os
import tempfile

import harness as h

STEPS = 12
WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")


def example(*args):
    losses = os.path.join(d, "losses.json")
    if os.path.exists(losses):
        os.remove(losses)
    return h.run(h.example("--workload", "mlp-small", "--steps", str(STEPS), "--warmup", "0", "--log-every", "4",
                           "--json", "--losses-out", losses, *args))


def finished(p, what):
    """The run trained every step: its loss list (written after the loop) is complete."""
    if p.returncode != 0:
        h.fail(f"{what}: exited {p.returncode}\n{p.stderr}")
    with open(os.path.join(d, "losses.json")) as f:
        losses = json.load(f)["losses"]
    if len(losses) != STEPS:
        h.fail(f"{what}: trained {len(losses)} steps, expected {STEPS}")


def warnings(p):
    # Not the once-per-run note that a tracker keeps no text (the worker logs text to all).
    return [l for l in p.stderr.splitlines() if "warn" in l.lower() and "keeps no text" not in l]


def jsonl_steps(path):
    with open(path) as f:
        return [r["step"] for r in map(json.loads, f) if r["type"] == "metrics" and "loss" in r]


with tempfile.TemporaryDirectory() as d:
    # All four trackers from the flag Accelerate users type.
    project_dir = os.path.join(d, "proj")
    p = example("--log_with", "tensorboard,mlflow,csv,jsonl", "--project_dir", project_dir)
    finished(p, "--log_with tensorboard,mlflow,csv,jsonl")
    run = os.path.join(project_dir, "hasten_logs", "hasten-example")
    for pattern in ["tensorboard/*/events.out.tfevents.*", "mlruns/*/*/metrics/loss", "metrics.csv", "metrics.jsonl"]:
        if not glob.glob(os.path.join(run, pattern)):
            h.fail(f"--log_with: nothing matches {run}/{pattern}")
    if jsonl_steps(os.path.join(run, "metrics.jsonl")) != [4, 8, 12]:
        h.fail(f"jsonl steps: {jsonl_steps(os.path.join(run, 'metrics.jsonl'))}")
    if warnings(p):
        h.fail(f"a healthy run warned:\n{p.stderr}")

    # The logging directory cannot be created (a file stands in its path; root cannot write there either).
    blocker = os.path.join(d, "a-file")
    open(blocker, "w").close()
    bad_dir = os.path.join(blocker, "logs")
    p = example("--log_with", "tensorboard,mlflow", "--set", f"logging_dir={bad_dir}")
    finished(p, "unwritable logging_dir")
    w = warnings(p)
    if len(w) != 1 or bad_dir not in w[0] or "'tensorboard'" not in w[0] or "'mlflow'" not in w[0]:
        h.fail(f"unwritable logging_dir: expected one warning naming both trackers and {bad_dir}, got:\n{p.stderr}")

    # One tracker's own directory fails: it is reported once and dropped; the others keep logging.
    logs = os.path.join(d, "logs2")
    store = os.path.join(blocker, "mlruns")
    p = example("--log_with", "mlflow,jsonl", "--set", f"logging_dir={logs}",
                "--set", f"tracker_options={{mlflow: {{tracking_dir: {store}}}}}")
    finished(p, "unwritable mlflow store")
    w = warnings(p)
    if len(w) != 1 or "'mlflow'" not in w[0] or blocker not in w[0]:
        h.fail(f"unwritable mlflow store: expected one warning naming mlflow and {blocker}, got:\n{p.stderr}")
    if jsonl_steps(os.path.join(logs, "hasten-example", "metrics.jsonl")) != [4, 8, 12]:
        h.fail("jsonl stopped logging when mlflow failed")

    # A tracker that fails mid-run (a full disk): one warning naming it and its file, the others go on.
    log_fails = os.path.join(os.path.dirname(h.BIN), "tests", "plugins", "failing", "libhasten-tracker-log_fails.so")
    logs = os.path.join(d, "logs4")
    p = h.run([WORKER], env={"HASTEN_LOG_WITH": f"{log_fails},jsonl", "HASTEN_LOGGING_DIR": logs})
    if p.returncode != 0:
        h.fail(f"mid-run tracker failure: exited {p.returncode}\n{p.stderr}")
    w = warnings(p)
    if len(w) != 1 or "'log_fails'" not in w[0] or os.path.join(logs, "trk", "log_fails.out") not in w[0]:
        h.fail(f"mid-run tracker failure: expected one warning naming log_fails and its file, got:\n{p.stderr}")
    if jsonl_steps(os.path.join(logs, "trk", "metrics.jsonl")) != [1, 2, 3, 4, 5]:
        h.fail("jsonl stopped logging when another tracker failed")

    # Both spellings naming different trackers: one clear error before training.
    h.check_clean_failure(h.run(h.example("--workload", "mlp-small", "--steps", "1", "--log_with", "csv",
                                          "--trackers", "jsonl")),
                          "--log_with and --trackers disagreeing", "log_with")

    # log_with: all starts every installed tracker.
    logs = os.path.join(d, "logs3")
    p = h.run([WORKER], env={"HASTEN_LOG_WITH": "all", "HASTEN_LOGGING_DIR": logs})
    if p.returncode != 0:
        h.fail(f"log_with all: exited {p.returncode}\n{p.stderr}")
    for pattern in ["tensorboard/*/events.out.tfevents.*", "mlruns/*/*/meta.yaml", "metrics.csv", "metrics.jsonl"]:
        if not glob.glob(os.path.join(logs, "trk", pattern)):
            h.fail(f"log_with all: nothing matches {logs}/trk/{pattern}")
    h.check_clean_failure(h.run([WORKER], env={"HASTEN_LOG_WITH": "all,csv", "HASTEN_LOGGING_DIR": logs}),
                          "log_with all with another tracker", "give it alone")

    # Two processes: one run per tracker, written by the main process only.
    project_dir = os.path.join(d, "two")
    p = h.run(h.hasten("launch", "--num_processes", "2", h.example()[0], "--workload", "mlp-small", "--steps", "8",
                       "--warmup", "0", "--log-every", "4", "--log_with", "tensorboard,mlflow",
                       "--project_dir", project_dir))
    if p.returncode != 0:
        h.fail(f"two processes with trackers: exited {p.returncode}\n{p.stderr}")
    run = os.path.join(project_dir, "hasten_logs", "hasten-example")
    tb_runs = glob.glob(os.path.join(run, "tensorboard", "*"))
    ml_runs = glob.glob(os.path.join(run, "mlruns", "*", "*", "meta.yaml"))
    if len(tb_runs) != 1 or len(ml_runs) != 1:
        h.fail(f"two processes: expected one TensorBoard run and one MLflow run, found {tb_runs} and {ml_runs}")
print("tracker failures: OK")
