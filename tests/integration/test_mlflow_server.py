"""Tracker mlflow against a real MLflow tracking server (MLflow's own `mlflow server` from
.venv-services, SQLite backend, on a free loopback port), read back with MLflow's Python client:

1. a run's every metric at every step, its params, tags and FINISHED status;
2. the server killed (SIGKILL) mid-run and started again on the same database: the run goes
   on, one warning names the journal, and afterwards every step is on the server exactly once;
3. no server when the run starts, one started later: nothing lost;
4. no server at all: the run ends within flush_timeout with exit 0, a warning names the
   journal, and the journal holds every metric; the next run from that directory, with the
   server up, sends that journal (the earlier run complete and FINISHED on the server, once)
   and removes it;
5. MLFLOW_TRACKING_URI naming the server, NaN and inf values, and a run that ends by an error:
   FAILED on the server;
6. the file store of an offline run, read by MLflow's client;
7. bad tracking_uri and flush_timeout values: one line each;
8. images, tables and text as the run's artifacts, downloaded by MLflow's client (the pixels,
   mlflow.load_table's table, the text): through the server's artifact proxy (mlflow server
   --artifacts-destination), into a server's local artifact root, and in the file store."""
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import harness as h
from mlflow_server import Server, free_port

MLFLOW_VENV = os.environ["HASTEN_TEST_SERVICES_VENV"]
MLFLOW = os.path.join(MLFLOW_VENV, "bin", "mlflow")
MLFLOW_PY = os.path.join(MLFLOW_VENV, "bin", "python")
if not os.path.exists(MLFLOW):
    h.fail(f"no {MLFLOW}: run `make deps` (scripts/install-deps.sh makes .venv-services)")
EXAMPLE = os.path.join(os.environ["HASTEN_TEST_BIN_DIR"], "hasten-example")
WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")
STEPS_KEYS = ("loss", "samples_per_s")

READER = r"""
import json, sys
from mlflow.tracking import MlflowClient
uri, experiment, run_name = sys.argv[1:4]
c = MlflowClient(uri)
e = c.get_experiment_by_name(experiment)
flt = "tags.`mlflow.runName` = '%s'" % run_name if run_name else ""
runs = c.search_runs([e.experiment_id], filter_string=flt) if e else []
out = []
for r in runs:
    out.append({"status": r.info.status, "end_time": r.info.end_time, "params": r.data.params,
                "tags": r.data.tags, "metrics": {k: [(m.step, m.value) for m in c.get_metric_history(r.info.run_id, k)]
                                                 for k in r.data.metrics}})
print(json.dumps(out))
"""


MEDIA_READER = r"""
import json, os, sys
import mlflow
import numpy as np
from PIL import Image
from mlflow.tracking import MlflowClient
uri, experiment, dst = sys.argv[1:4]
mlflow.set_tracking_uri(uri)
c = MlflowClient(uri)
e = c.get_experiment_by_name(experiment)
r = c.search_runs([e.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)[0]
local = c.download_artifacts(r.info.run_id, "", dst)
files = {}
for root, _, names in os.walk(local):
    for n in names:
        p = os.path.join(root, n)
        rel = os.path.relpath(p, local)
        if n.endswith(".png"):
            a = np.asarray(Image.open(p))
            files[rel] = {"shape": list(a.shape), "pixels": a.reshape(-1).tolist()}
        else:
            files[rel] = open(p).read()
table = c.load_table(e.experiment_id, "tables/samples/step_2.json", run_ids=[r.info.run_id])
print(json.dumps({"status": r.info.status, "artifact_uri": r.info.artifact_uri, "files": files,
                  "table": {"columns": list(table.columns), "data": table.values.tolist()}}))
"""


def expected_media():
    """The artifacts of tracker_run.cpp --media: {path: pixels (HWC uint8) or text}."""
    import torch
    rgb = torch.arange(3 * 6 * 8, dtype=torch.float32).reshape(3, 6, 8) / 143.0
    rgb = (rgb * 255).clamp(0, 255).to(torch.uint8).permute(1, 2, 0)  # SummaryWriter's rule
    grey = (torch.arange(6).reshape(6, 1) * 30 + torch.arange(8).reshape(1, 8)).to(torch.uint8)
    rgba = ((torch.arange(5).reshape(5, 1, 1) * 12 + torch.arange(6).reshape(1, 6, 1) * 4 +
             torch.arange(4).reshape(1, 1, 4)) * 3).to(torch.uint8)
    want = {}
    for step in (1, 2):
        for name, img in (("rgb", rgb), ("grey", grey), ("rgba", rgba)):
            want[f"images/{name}/step_{step}.png"] = {"shape": list(img.shape), "pixels": img.reshape(-1).tolist()}
        want[f"text/notes/step_{step}.txt"] = f"step {step}"
        want[f"tables/samples/step_{step}.json"] = None  # read by mlflow.load_table
    return want


def check_media(uri, what, env=None, experiment="trk"):
    """Runs the media worker against uri (a server or a file store) and reads its artifacts back."""
    with tempfile.TemporaryDirectory() as dst:
        logs = os.path.join(dst, "logs")
        run_env = {"HASTEN_LOG_WITH": "mlflow", "HASTEN_LOGGING_DIR": logs, **(env or {})}
        p = h.run([WORKER, "--media"], env=run_env)
        if p.returncode != 0:
            h.fail(f"{what}: the media worker exited {p.returncode}:\n{p.stderr[-3000:]}")
        line = "tracker 'mlflow' keeps no histograms: log_histogram skips it (said once)"
        if p.stderr.count(line) != 1:
            h.fail(f"{what}: {p.stderr.count(line)} lines {line!r} (want 1):\n{p.stderr[-3000:]}")
        if "artifacts not stored" in p.stderr:
            h.fail(f"{what}: artifacts were not stored:\n{p.stderr[-3000:]}")
        reader_env = dict(os.environ, MLFLOW_ALLOW_FILE_STORE="true")
        out = subprocess.run([MLFLOW_PY, "-c", MEDIA_READER, uri, experiment, os.path.join(dst, "down")],
                             capture_output=True, text=True, timeout=120, env=reader_env)
        if out.returncode != 0:
            h.fail(f"{what}: MLflow's client could not read the artifacts:\n{out.stderr[-2000:]}")
        got = json.loads(out.stdout)
    want = expected_media()
    if got["status"] != "FINISHED" or sorted(got["files"]) != sorted(want):
        h.fail(f"{what}: status {got['status']}, artifacts {sorted(got['files'])} (want {sorted(want)})")
    for path, value in want.items():
        if value is not None and got["files"][path] != value:
            h.fail(f"{what}: artifact {path} is {str(got['files'][path])[:300]} (want {str(value)[:300]})")
    if got["table"] != {"columns": ["id", "text", "score"], "data": [[1, "a|b", 0.5], [2, "c", -1]]}:
        h.fail(f"{what}: mlflow.load_table read {got['table']}")
    return got["artifact_uri"]


def read_runs(uri, experiment, run_name, env=None):
    p = subprocess.run([MLFLOW_PY, "-c", READER, uri, experiment, run_name], capture_output=True, text=True,
                       timeout=120, env=env)
    if p.returncode != 0:
        h.fail(f"MLflow's client could not read {uri}:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def train(project, run_name, steps, options, env=None, background=False):
    cmd = [EXAMPLE, "--workload", "mlp-small", "--steps", str(steps), "--warmup", "0", "--log_every", "1",
           "--quiet", "--project_dir", project, "--log_with", "mlflow",
           "--set", "tracker_options={mlflow: {run_name: %s, %s}}" % (run_name, options)]
    full_env = dict(os.environ, **(env or {}))
    if background:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return h.run(cmd, env=env, timeout=300)


def check_run(uri, run_name, steps, what, env=None):
    runs = read_runs(uri, "hasten-example", run_name, env)
    if len(runs) != 1:
        h.fail(f"{what}: {len(runs)} runs named {run_name} (want 1)")
    r = runs[0]
    if r["status"] != "FINISHED" or not r["end_time"]:
        h.fail(f"{what}: status {r['status']}, end_time {r['end_time']}")
    for key in STEPS_KEYS:
        got = [s for s, _ in r["metrics"].get(key, [])]
        if sorted(got) != list(range(1, steps + 1)):
            missing = sorted(set(range(1, steps + 1)) - set(got))
            dup = len(got) - len(set(got))
            h.fail(f"{what}: metric {key}: {len(got)} values, missing steps {missing[:10]}, {dup} repeated")
    want = {"workload": "mlp-small", "steps": str(steps), "strategy": "single", "num_processes": "1",
            "mixed_precision": "no", "gradient_accumulation_steps": "1", "batch_size": "32"}
    if r["params"] != want:
        h.fail(f"{what}: params {r['params']} (want {want})")
    for tag in ("mlflow.runName", "mlflow.user", "mlflow.source.name", "mlflow.source.type"):
        if not r["tags"].get(tag):
            h.fail(f"{what}: no tag {tag} in {r['tags']}")
    if not r["tags"]["mlflow.source.name"].endswith("hasten-example"):
        h.fail(f"{what}: mlflow.source.name {r['tags']['mlflow.source.name']}")
    return r


def journals(project):
    d = os.path.join(project, "hasten_logs", "hasten-example", "mlflow-journal")
    return [os.path.join(d, f) for f in os.listdir(d)] if os.path.isdir(d) else []


with tempfile.TemporaryDirectory() as d:
    server = Server(d, free_port())
    try:
        # 1. A run against a server that stays up.
        server.start()
        # 8a. Artifacts through the server's artifact proxy: on the server's disk, not written here.
        uri = check_media(server.uri, "artifacts through the proxy",
                          {"MLFLOW_TRACKING_URI": server.uri,
                           "HASTEN_TRACKER_OPTIONS": "{mlflow: {experiment_name: trk-proxy}}"}, "trk-proxy")
        if not uri.startswith("mlflow-artifacts:") or not os.path.isdir(os.path.join(d, "artifacts")):
            h.fail(f"artifacts through the proxy: artifact_uri {uri}, server's store {os.listdir(d)}")
        project = os.path.join(d, "p1")
        p = train(project, "steady", 30, f"tracking_uri: '{server.uri}'")
        if p.returncode != 0:
            h.fail(f"steady run exited {p.returncode}:\n{p.stderr[-3000:]}")
        r = check_run(server.uri, "steady", 30, "steady run")
        if abs(r["metrics"]["final_loss"][0][1] - r["metrics"]["loss"][-1][1]) > 1e-6:
            h.fail(f"final_loss {r['metrics']['final_loss']} is not the last loss {r['metrics']['loss'][-1]}")
        if journals(project):
            h.fail(f"a run whose records all reached the server left journals: {journals(project)}")

        # 2. The server killed mid-run and started again on the same database.
        project = os.path.join(d, "p2")
        steps = 150
        run = train(project, "outage", steps, f"tracking_uri: '{server.uri}', flush_timeout: 45",
                    env={"HASTEN_TEST_STEP_DELAY_MS": "100"}, background=True)
        deadline = time.time() + 60
        while server.logged_steps("hasten-example", "outage") < 10:
            if run.poll() is not None or time.time() > deadline:
                h.fail("the outage run logged no 10 steps to the server before it ended or 60 s passed")
            time.sleep(0.2)
        before_kill = server.logged_steps("hasten-example", "outage")
        server.kill()
        time.sleep(2)
        if run.poll() is not None:
            h.fail("the outage run ended before the server came back: make it longer")
        server.start()
        out, err = run.communicate(timeout=300)
        if run.returncode != 0:
            h.fail(f"outage run exited {run.returncode}:\n{err[-3000:]}")
        if "did not take the run's records" not in err or "mlflow-journal" not in err:
            h.fail(f"no warning naming the journal while the server was away:\n{err[-3000:]}")
        if "answers again" not in err:
            h.fail(f"no line saying the server answers again:\n{err[-3000:]}")
        if before_kill >= steps:
            h.fail(f"the server held all {steps} steps before it was killed: the outage missed the run")
        check_run(server.uri, "outage", steps, "run across a server restart")
        if journals(project):
            h.fail(f"the outage run's records all reached the server, yet journals stay: {journals(project)}")

        # 3. No server when the run starts; one comes up later.
        server.kill()
        project = os.path.join(d, "p3")
        run = train(project, "late", 60, f"tracking_uri: '{server.uri}', flush_timeout: 45",
                    env={"HASTEN_TEST_STEP_DELAY_MS": "60"}, background=True)
        time.sleep(1.5)
        server.start()
        out, err = run.communicate(timeout=300)
        if run.returncode != 0:
            h.fail(f"late-server run exited {run.returncode}:\n{err[-3000:]}")
        check_run(server.uri, "late", 60, "run started before its server")
        server.kill()

        # 4. No server at all: bounded end, exit 0, every record in the journal.
        project = os.path.join(d, "p4")
        t0 = time.time()
        p = train(project, "alone", 20, f"tracking_uri: '{server.uri}', flush_timeout: 2")
        took = time.time() - t0
        if p.returncode != 0:
            h.fail(f"a run without its server exited {p.returncode}:\n{p.stderr[-3000:]}")
        if took > 25:
            h.fail(f"a run without its server took {took:.0f} s (flush_timeout 2)")
        found = journals(project)
        if len(found) != 1 or found[0] not in p.stderr or "did not reach" not in p.stderr:
            h.fail(f"journal {found} not named in the warning:\n{p.stderr[-3000:]}")
        with open(found[0]) as f:
            lines = [json.loads(line) for line in f]
        loss_steps = sorted(x["metric"]["step"] for x in lines if "metric" in x and x["metric"]["key"] == "loss")
        if loss_steps != list(range(1, 21)) or not any(x.get("status") == "FINISHED" for x in lines):
            h.fail(f"the journal holds loss steps {loss_steps} and statuses "
                   f"{[x['status'] for x in lines if 'status' in x]}")

        # 4b. The server is back: the next run from p4 sends the journal the last one left.
        server.start()
        p = train(project, "after", 3, f"tracking_uri: '{server.uri}'")
        if p.returncode != 0 or "sending the records an earlier run left in " + found[0] not in p.stderr:
            h.fail(f"the run after an outage did not send the journal {found[0]}: exit {p.returncode}\n{p.stderr[-3000:]}")
        check_run(server.uri, "alone", 20, "a journal sent by the next run")
        check_run(server.uri, "after", 3, "the run that sent an earlier journal")
        if journals(project):
            h.fail(f"journals stay after the next run sent them: {journals(project)}")

        # 5. MLFLOW_TRACKING_URI names the server; NaN and inf values; a run that ends by an
        # error (no end_training) is FAILED there, within the tracker host's limits.
        logs = os.path.join(d, "p5")
        p = h.run([WORKER, "--fail"], env={"HASTEN_LOG_WITH": "mlflow", "HASTEN_LOGGING_DIR": logs,
                                           "MLFLOW_TRACKING_URI": server.uri})
        if p.returncode == 0 or "injected failure" not in p.stderr:
            h.fail(f"the failing worker exited {p.returncode}:\n{p.stderr[-2000:]}")
        runs = read_runs(server.uri, "trk", "")
        if len(runs) != 1 or runs[0]["status"] != "FAILED":
            h.fail(f"a run that ended by an error: {[(r['status'], r['end_time']) for r in runs]} (want one FAILED)")
        loss = dict(runs[0]["metrics"]["loss"])
        acc = dict(runs[0]["metrics"]["acc"])
        # MLflow's SQL store keeps +inf as the largest double (sys.float_info.max).
        if sorted(loss) != [1, 2, 3, 4, 5] or not math.isnan(loss[3]) or acc[4] not in (math.inf, sys.float_info.max) \
                or loss[2] != 0.5:
            h.fail(f"NaN and inf on the server: loss {loss}, acc {acc}")
        server.kill()

        # 8b. A server that leaves artifacts to its clients (a local root): the tracker writes
        # them there. The root applies to experiments made from then on: a new one.
        server.start(artifacts="local")
        uri = check_media(server.uri, "artifacts in the server's local root",
                          {"MLFLOW_TRACKING_URI": server.uri,
                           "HASTEN_TRACKER_OPTIONS": "{mlflow: {experiment_name: trk-local}}"}, "trk-local")
        if not uri.startswith(os.path.join(d, "local-artifacts")):
            h.fail(f"artifacts in the server's local root: artifact_uri {uri}")
    finally:
        server.kill()

    # 6. The file store of an offline run, read by MLflow's client.
    store = os.path.join(d, "mlruns")
    p = train(os.path.join(d, "p5"), "offline", 12, f"tracking_dir: '{store}'")
    if p.returncode != 0:
        h.fail(f"file-store run exited {p.returncode}:\n{p.stderr[-3000:]}")
    check_run("file://" + store, "offline", 12, "file store", env=dict(os.environ, MLFLOW_ALLOW_FILE_STORE="true"))
    # 8c. Artifacts in the file store.
    check_media("file://" + store, "artifacts in the file store",
                {"HASTEN_TRACKER_OPTIONS": "{mlflow: {tracking_dir: '%s'}}" % store})

    # 7. Bad values.
    bad = train(os.path.join(d, "p6"), "bad", 2, "tracking_uri: 'ftp://127.0.0.1:1'")
    h.check_clean_failure(bad, "tracking_uri ftp", "is not a tracking server (allowed: http://HOST:PORT")
    bad = train(os.path.join(d, "p6"), "bad", 2, f"tracking_uri: 'http://127.0.0.1:1', tracking_dir: '{store}'")
    h.check_clean_failure(bad, "tracking_uri and tracking_dir", "tracking_dir and tracking_uri both given")
    bad = train(os.path.join(d, "p6"), "bad", 2, "tracking_uri: 'http://127.0.0.1:1', flush_timeout: -1")
    h.check_clean_failure(bad, "flush_timeout -1", "flush_timeout")
    bad = train(os.path.join(d, "p6"), "bad", 2, "tracking_uri: 'http://127.0.0.1:1', flush_timeout: 60")
    h.check_clean_failure(bad, "flush_timeout 60", "flush_timeout")
print("mlflow server: OK")
