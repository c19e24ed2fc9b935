"""Tracker mlflow: the file store holds what MLflow's FileStore reads (experiment and run
meta.yaml with their required keys and types, metric lines "timestamp value step" with NaN
and inf, params, mlflow.* tags), a finished run is FINISHED with an end_time, and a run that
ends by an error is FAILED in the same experiment."""
import glob
import math
import os
import re
import tempfile

import yaml

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")
FINISHED, FAILED = 3, 4  # MLflow's RunStatus numbers


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def read(path):
    with open(path) as f:
        return f.read()


def metric(path):
    """Lines as FileStore._get_metric_from_line reads them: 'timestamp value [step]'."""
    text = read(path)
    if not text:
        h.fail(f"{path} is empty (MLflow refuses an empty metric file)")
    out = []
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) != 3:
            h.fail(f"{path}: line {line!r} is not 'timestamp value step'")
        out.append((int(parts[0]), float(parts[1]), int(parts[2])))
    return out


def runs(store):
    found = []
    for exp_dir in sorted(glob.glob(os.path.join(store, "*"))):
        exp_id = os.path.basename(exp_dir)
        if exp_id == "0" or not os.path.isdir(exp_dir):
            continue
        for meta in glob.glob(os.path.join(exp_dir, "*", "meta.yaml")):
            found.append((exp_id, os.path.dirname(meta), load(meta)))
    return found


with tempfile.TemporaryDirectory() as logs:
    env = {"HASTEN_LOG_WITH": "mlflow", "HASTEN_LOGGING_DIR": logs}
    p = h.run([WORKER], env=env)
    if p.returncode != 0:
        h.fail(f"tracker run exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    store = os.path.join(logs, "trk", "mlruns")
    default = load(os.path.join(store, "0", "meta.yaml"))
    if default.get("experiment_id") != "0" or default.get("name") != "Default":
        h.fail(f"Default experiment meta.yaml: {default}")
    if not os.path.isdir(os.path.join(store, ".trash")):
        h.fail("no .trash directory in the store")
    exps = [d for d in os.listdir(store) if d not in ("0", ".trash")]
    if len(exps) != 1:
        h.fail(f"expected one experiment besides Default, found {exps}")
    exp = load(os.path.join(store, exps[0], "meta.yaml"))
    for key, want in [("experiment_id", exps[0]), ("name", "trk"), ("lifecycle_stage", "active"),
                      ("artifact_location", "file://" + os.path.realpath(os.path.join(store, exps[0])))]:
        if exp.get(key) != want:
            h.fail(f"experiment meta.yaml {key}: {exp.get(key)!r}, expected {want!r}")
    if not isinstance(exp.get("creation_time"), int):
        h.fail(f"experiment creation_time: {exp.get('creation_time')!r}")

    (exp_id, run_dir, meta), = runs(store)
    run_id = os.path.basename(run_dir)
    if not re.fullmatch(r"[0-9a-f]{32}", run_id):
        h.fail(f"run id {run_id!r} is not 32 lowercase hex digits")
    for key in ["run_uuid", "experiment_id", "user_id", "start_time", "end_time"]:  # RunInfo's required keys
        if key not in meta:
            h.fail(f"run meta.yaml lacks {key}: {meta}")
    if (meta["run_uuid"], meta["run_id"], meta["experiment_id"]) != (run_id, run_id, exp_id):
        h.fail(f"run meta.yaml ids: {meta}")
    if meta["status"] != FINISHED or not isinstance(meta["end_time"], int) or meta["end_time"] < meta["start_time"]:
        h.fail(f"finished run: status {meta['status']!r}, start {meta['start_time']!r}, end {meta['end_time']!r}")
    if meta["lifecycle_stage"] != "active" or meta["source_type"] != 4 or meta["tags"] != []:
        h.fail(f"run meta.yaml: {meta}")

    loss = metric(os.path.join(run_dir, "metrics", "loss"))
    acc = metric(os.path.join(run_dir, "metrics", "acc"))
    if [s for _, _, s in loss] != [1, 2, 3, 4, 5] or [s for _, _, s in acc] != [1, 2, 3, 4, 5]:
        h.fail(f"metric steps: loss {loss}, acc {acc}")
    lv = [v for _, v, _ in loss]
    if lv[:2] != [1.0, 0.5] or not math.isnan(lv[2]) or lv[3:] != [0.25, 0.2]:
        h.fail(f"loss values {lv}")
    if [v for _, v, _ in acc] != [0.1, 0.2, 0.3, math.inf, 0.5]:
        h.fail(f"acc values {[v for _, v, _ in acc]}")
    if not all(meta["start_time"] <= t <= meta["end_time"] for t, _, _ in loss):
        h.fail(f"metric timestamps outside the run: {loss}")

    params = {k: read(os.path.join(run_dir, "params", k)) for k in os.listdir(os.path.join(run_dir, "params"))}
    if params != {"lr": "0.001", "model": "mlp", "layers": "3", "bf16": "False"}:
        h.fail(f"params: {params}")
    tags = {k: read(os.path.join(run_dir, "tags", k)) for k in os.listdir(os.path.join(run_dir, "tags"))}
    if tags.get("mlflow.runName") != meta["run_name"] or not meta["run_name"].startswith("trk-") \
            or tags.get("mlflow.source.type") != "LOCAL" or not tags.get("mlflow.user") \
            or not tags.get("mlflow.source.name", "").endswith("hasten-test-trackers"):
        h.fail(f"tags: {tags}, run_name {meta['run_name']!r}")

    p = h.run([WORKER, "--fail"], env=env)
    if p.returncode != 1 or "injected failure" not in p.stderr:
        h.fail(f"failing run exited {p.returncode}:\n{p.stderr}")
    all_runs = runs(store)
    if len(all_runs) != 2 or {e for e, _, _ in all_runs} != {exp_id}:
        h.fail(f"expected two runs in experiment {exp_id}, found {[(e, d) for e, d, _ in all_runs]}")
    failed = [m for _, d, m in all_runs if d != run_dir]
    if failed[0]["status"] != FAILED or not isinstance(failed[0]["end_time"], int):
        h.fail(f"run ended by an error: status {failed[0]['status']!r}, end_time {failed[0]['end_time']!r}")

    # A meta.yaml whose experiment_id would lead the run's files out of the store is refused.
    meta_path = os.path.join(store, exps[0], "meta.yaml")
    text = read(meta_path)
    with open(meta_path, "w") as f:
        f.write(text.replace(f"experiment_id: '{exps[0]}'", "experiment_id: '../../escaped'")
                    .replace(f"experiment_id: \"{exps[0]}\"", "experiment_id: '../../escaped'")
                    .replace(f"experiment_id: {exps[0]}", "experiment_id: '../../escaped'"))
    if "escaped" not in read(meta_path):
        h.fail(f"the test could not edit experiment_id in:\n{text}")
    p = h.run([WORKER], env=env)
    if "is not its directory's name of digits" not in p.stderr:
        h.fail(f"a crafted experiment_id was not refused:\n{p.stdout}\n{p.stderr}")
    if glob.glob(os.path.join(logs, "**", "escaped"), recursive=True) or os.path.exists(os.path.join(os.path.dirname(logs), "escaped")):
        h.fail("a crafted experiment_id made a directory outside the experiment")
    print("ok: a crafted experiment_id is refused: " + [l for l in p.stderr.splitlines() if "digits" in l][0][-120:])

    # Credentials in MLFLOW_TRACKING_URI are never printed.
    p = h.run([WORKER], env={**env, "MLFLOW_TRACKING_URI": "http://alice:s3cret-token@tracking.example:5000/x"})
    if "s3cret" in p.stdout + p.stderr or "***@tracking.example:5000" not in p.stderr:
        h.fail(f"MLFLOW_TRACKING_URI's credentials were printed or the URI not named:\n{p.stderr}")
    print("ok: MLFLOW_TRACKING_URI's credentials are not printed")
print("tracker mlflow: OK")
