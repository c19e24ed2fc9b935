"""Accelerator::get_tracker: each running tracker's handle says what names its run in the
tracker's own terms, checked against the files it wrote (tensorboard's log_dir and event file,
TensorBoard's EventAccumulator reading the run; jsonl's file; the MLflow file store's run_id,
experiment_id and artifact_uri, read by MLflow's own file-store layout), and logs to that
tracker alone; csv names its file; a tracker built against ABI 1.9, before the run_info slot,
names nothing but still logs; a name not running is
one UsageError naming the running ones. In a tracker host process and in the training process.
Under hasten launch with 2 processes the other rank gets blank handles, which log nothing."""
import json
import re
import os
import tempfile

from tensorboard.backend.event_processing import event_accumulator

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")
# tests/abi's tracker built against the frozen 1.9 header (its name is v1_0_tracker).
OLD = os.environ["HASTEN_TEST_OLD_TRACKER"]
NAMES = "jsonl,tensorboard,mlflow,csv,v1_0_tracker"


def parse(out):
    trackers, info, unknown = [], {}, []
    for line in out.splitlines():
        if line.startswith("tracker "):
            _, rank, name, blank = line.split(" ")
            trackers.append((int(rank), name, blank == "blank=1"))
        elif line.startswith("info "):
            _, name, kv = line.split(" ", 2)
            key, value = kv.split("=", 1)
            info.setdefault(name, {})[key] = value
        elif line.startswith("unknown: "):
            unknown.append(line[len("unknown: "):])
    return trackers, info, unknown


with tempfile.TemporaryDirectory() as d:
    for mode, extra in (("tracker host process", {}), ("training process", {"HASTEN_TRACKERS_IN_PROCESS": "true"})):
        logs = os.path.join(d, mode.replace(" ", "-"))
        p = h.run([WORKER, "--get-tracker", NAMES], env={"HASTEN_LOG_WITH": NAMES.replace("v1_0_tracker", OLD), "HASTEN_LOGGING_DIR": logs, **extra})
        if p.returncode != 0:
            h.fail(f"{mode}: worker exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        trackers, info, unknown = parse(p.stdout)
        if trackers != [(0, n, False) for n in NAMES.split(",")]:
            h.fail(f"{mode}: handles {trackers}")
        run = os.path.join(logs, "trk")
        # jsonl: its file, holding the handle's value and no other tracker's.
        if info.get("jsonl") != {"file": os.path.join(run, "metrics.jsonl")}:
            h.fail(f"{mode}: jsonl run_info {info.get('jsonl')}")
        with open(info["jsonl"]["file"]) as f:
            lines = [json.loads(x) for x in f]
        if not any(x.get("only") == 1 and x.get("step") == 1 for x in lines):
            h.fail(f"{mode}: the handle's log is not in {info['jsonl']['file']}: {lines}")
        # tensorboard: the run's directory and event file, which EventAccumulator reads; the
        # value logged through the jsonl handle is not there.
        tb = info.get("tensorboard", {})
        if os.path.dirname(tb.get("log_dir", "")) != os.path.join(run, "tensorboard") or \
                os.path.dirname(tb.get("event_file", "")) != tb["log_dir"] or not os.path.isfile(tb["event_file"]):
            h.fail(f"{mode}: tensorboard run_info {tb}")
        acc = event_accumulator.EventAccumulator(tb["log_dir"])
        acc.Reload()
        if "only" in acc.Tags()["scalars"]:
            h.fail(f"{mode}: the jsonl handle's value reached tensorboard: {acc.Tags()['scalars']}")
        # mlflow (file store): the run directory the ids name, its artifact directory.
        ml = info.get("mlflow", {})
        store = os.path.join(run, "mlruns")
        run_dir = os.path.join(store, ml.get("experiment_id", "?"), ml.get("run_id", "?"))
        if ml.get("tracking_uri") != "file://" + store or not os.path.isfile(os.path.join(run_dir, "meta.yaml")) or \
                ml.get("artifact_uri") != "file://" + os.path.join(run_dir, "artifacts") or \
                ml.get("experiment_name") != "trk" or not ml.get("run_name", "").startswith("trk-"):
            h.fail(f"{mode}: mlflow run_info {ml}")
        with open(os.path.join(run_dir, "meta.yaml")) as f:
            meta = f.read()
        # meta.yaml quotes the id ('...'): MLflow's own reader takes it either way.
        if not re.search(rf"^run_id: '?{ml['run_id']}'?$", meta, re.M) or not re.search(r"^status: 3$", meta, re.M):
            h.fail(f"{mode}: the run that mlflow's run_info names: {meta}")
        if os.path.exists(os.path.join(run_dir, "metrics", "only")):
            h.fail(f"{mode}: the jsonl handle's value reached mlflow")
        # csv: its file, without the jsonl handle's value.
        if info.get("csv") != {"file": os.path.join(run, "metrics.csv")}:
            h.fail(f"{mode}: csv run_info {info.get('csv')}")
        with open(info["csv"]["file"]) as f:
            header = f.readline()
        if "loss" not in header or "only" in header:
            h.fail(f"{mode}: csv header {header!r}")
        # The 1.9 tracker has no run_info slot: a handle naming nothing, on a tracker that logged.
        if "v1_0_tracker" in info or (0, "v1_0_tracker", False) not in trackers:
            h.fail(f"{mode}: the 1.9 tracker: handles {trackers}, run_info {info.get('v1_0_tracker')}")
        with open(os.path.join(run, "v1_0_tracker.txt")) as f:
            if not any(line.split()[1:2] == ["loss"] for line in f):
                h.fail(f"{mode}: the 1.9 tracker logged no loss")
        want = "get_tracker: no running tracker 'nope' (running: jsonl, tensorboard, mlflow, csv, v1_0_tracker)"
        if unknown != [want]:
            h.fail(f"{mode}: unknown name: {unknown} (want [{want!r}])")

    # Two processes: rank 1's handles are blank (no run_info, log does nothing, no error for a
    # name not running), rank 0's are the trackers'.
    logs = os.path.join(d, "launch")
    p = h.run(h.hasten("launch", "--num_processes", "2", WORKER, "--get-tracker", "jsonl,tensorboard"),
              env={"HASTEN_LOG_WITH": "jsonl,tensorboard", "HASTEN_LOGGING_DIR": logs})
    if p.returncode != 0:
        h.fail(f"two processes: exit {p.returncode}:\n{p.stdout}\n{p.stderr}")
    trackers, info, unknown = parse("\n".join(line.split("] ", 1)[-1] for line in p.stdout.splitlines()))
    if sorted(trackers) != [(0, "jsonl", False), (0, "tensorboard", False), (1, "jsonl", True), (1, "tensorboard", True)]:
        h.fail(f"two processes: handles {sorted(trackers)}\n{p.stdout}")
    if len(unknown) != 1 or set(info) != {"jsonl", "tensorboard"}:
        h.fail(f"two processes: unknown {unknown}, run_info of {sorted(info)}\n{p.stdout}")
    with open(os.path.join(logs, "trk", "metrics.jsonl")) as f:
        onlys = [x for x in map(json.loads, f) if "only" in x]
    if len(onlys) != 1:
        h.fail(f"two processes: {len(onlys)} values logged through handles (want rank 0's one)")
print("tracker handle: OK")
