"""Tracker mlflow against a real MLflow tracking server (`mlflow server` from .venv-services,
SQLite backend, on a free loopback port): the two recoveries of rest_run.cpp and
journal_replay.cpp that test_mlflow_server.py does not reach, read back with MLflow's Python
client.

1. A lost runs/create answer: a TCP proxy written here sits between the tracker and the server,
   forwards the first runs/create to the server, waits for the server's answer (the run is
   made) and closes the connection instead of relaying it. The tracker must find that run by
   its hasten.run_token tag (runs/search) and log into it: exactly one run in the experiment,
   the one the lost answer named, FINISHED, every metric at every step exactly once; through
   the proxy a runs/search right after the lost runs/create and no second runs/create (libcurl
   resent it by itself on a reused connection: rest_client.cpp's `once`).
2. The replay of journals whose process died (SIGKILL, in-process trackers, so nothing wrote
   an end status line): run "dead" made on the server, then the server killed, and the process
   killed at step 40 while the server is away; run "dead-offline" killed at step 5 with no
   server at all (its run never made). With the server back, the next run from the same
   logging directory sends both journals: each earlier run exactly once on the server, with
   every metric its journal holds (the values and timestamps logged, no step twice), its
   journal's start time, FAILED (journal_replay.cpp: "FAILED at its last record when the
   journal has none") with end_time its last metric's timestamp; the next run FINISHED; the
   journals gone."""
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
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
KEYS = ("loss", "samples_per_s")

# Every run of an experiment (all of them: a second run made by mistake has the same name).
READER = r"""
import json, sys
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
uri, experiment = sys.argv[1:3]
c = MlflowClient(uri)
e = c.get_experiment_by_name(experiment)
runs = c.search_runs([e.experiment_id], run_view_type=ViewType.ALL) if e else []
print(json.dumps([{"run_id": r.info.run_id, "name": r.data.tags.get("mlflow.runName"), "status": r.info.status,
                   "start_time": r.info.start_time, "end_time": r.info.end_time, "tags": r.data.tags,
                   "metrics": {k: [(m.step, m.value, m.timestamp) for m in c.get_metric_history(r.info.run_id, k)]
                               for k in r.data.metrics}} for r in runs]))
"""


class LostCreateProxy:
    """A loopback TCP proxy in front of a server: bytes go both ways as they come, except the
    answer to the first POST .../runs/create. That request is forwarded; once the server's
    answer to it arrives (the run is made, the answer only follows the commit), both ends of
    the connection are closed and the answer is thrown away: the client sees the connection
    end with no reply. The request lines it saw are kept, in order."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.uri = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests = []          # "POST /api/2.0/mlflow/runs/create", ...
        self.lost_answer = None     # the body of the runs/create answer thrown away
        self.dropped = threading.Event()  # the runs/create answer was thrown away
        self.lock = threading.Lock()
        self.create_seen = False
        self.open = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        for s in [self.listener] + self.open:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            self.open += [client, server]
            conn = {"drop_answer": False, "closed": False}
            threading.Thread(target=self._upstream, args=(client, server, conn), daemon=True).start()
            threading.Thread(target=self._downstream, args=(client, server, conn), daemon=True).start()

    def _keep_answer(self, server, data):
        """Reads the rest of the thrown-away answer (Content-Length) and keeps its body."""
        server.settimeout(10)
        while b"\r\n\r\n" not in data:
            data += server.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = [int(f.split(b":", 1)[1]) for f in head.split(b"\r\n")[1:]
                  if f.lower().startswith(b"content-length:")]
        while length and len(body) < length[0]:
            body += server.recv(65536)
        self.dropped.set()
        self.lost_answer = json.loads(body)  # fails (and leaves None) on an answer of another form

    @staticmethod
    def _shut(client, server, conn):
        conn["closed"] = True
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _upstream(self, client, server, conn):
        """Client to server, following the requests (headers, then Content-Length bytes of body:
        what libcurl sends) so that each request line is seen before its last byte goes on."""
        buf, body_left = b"", 0
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                while True:
                    if body_left:
                        n = min(body_left, len(buf))
                        body_left -= n
                        buf = buf[n:]
                        if body_left:
                            break
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        break
                    head = buf[:end].decode("latin-1").split("\r\n")
                    buf = buf[end + 4:]
                    line = " ".join(head[0].split(" ")[:2])
                    for field in head[1:]:
                        name, _, value = field.partition(":")
                        if name.strip().lower() == "content-length":
                            body_left = int(value.strip())
                    with self.lock:
                        self.requests.append(line)
                        if line.endswith("/runs/create") and not self.create_seen:
                            self.create_seen = True
                            conn["drop_answer"] = True  # before the request's end goes on
                server.sendall(data)
        except OSError:
            pass
        if not conn["closed"]:
            self._shut(client, server, conn)

    def _downstream(self, client, server, conn):
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                if conn["drop_answer"]:  # the server answered runs/create: the run exists
                    self._keep_answer(server, data)
                    break
                client.sendall(data)
        except (OSError, ValueError):
            pass
        if not conn["closed"]:
            self._shut(client, server, conn)


def read_runs(uri, experiment):
    p = subprocess.run([MLFLOW_PY, "-c", READER, uri, experiment], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        h.fail(f"MLflow's client could not read {uri}:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def example(project, run_name, steps, uri, env=None, background=False, delay_ms=None, experiment=None):
    options = f"run_name: {run_name}, tracking_uri: '{uri}', flush_timeout: 30"
    if experiment:
        options += f", experiment_name: {experiment}"
    cmd = [EXAMPLE, "--workload", "mlp-small", "--steps", str(steps), "--warmup", "0", "--log_every", "1",
           "--quiet", "--project_dir", project, "--log_with", "mlflow",
           "--set", "tracker_options={mlflow: {%s}}" % options]
    full_env = dict(os.environ, **(env or {}))
    if delay_ms:
        full_env["HASTEN_TEST_STEP_DELAY_MS"] = str(delay_ms)
    if background:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=120)


def journal_dir(project):
    return os.path.join(project, "hasten_logs", "hasten-example", "mlflow-journal")


def journal_files(project):
    d = journal_dir(project)
    return sorted(os.path.join(d, f) for f in os.listdir(d)) if os.path.isdir(d) else []


def read_journal(path):
    """(the run line, {key: {step: (value, timestamp)}}, the status lines) of a journal."""
    run, metrics, status = None, {}, []
    with open(path) as f:
        for text in f:
            line = json.loads(text)
            if "run" in line:
                run = line["run"]
            elif "metric" in line:
                m = line["metric"]
                if m["step"] in metrics.setdefault(m["key"], {}):
                    h.fail(f"{path} logs {m['key']} at step {m['step']} twice")
                metrics[m["key"]][m["step"]] = (m["value"], m["timestamp"])
            elif "status" in line:
                status.append(line)
    return run, metrics, status


def check_metrics(what, run, want):
    """The run's history of each metric in want ({key: {step: (value, timestamp)}}) is that,
    each step once."""
    for key, steps in want.items():
        got = run["metrics"].get(key, [])
        seen = [s for s, _, _ in got]
        if len(seen) != len(set(seen)):
            h.fail(f"{what}: metric {key} holds {len(seen) - len(set(seen))} steps twice")
        got = {s: (v, t) for s, v, t in got}
        if got != steps:
            missing = sorted(set(steps) - set(got))
            wrong = sorted(s for s in set(steps) & set(got) if got[s] != steps[s])
            extra = sorted(set(got) - set(steps))
            h.fail(f"{what}: metric {key}: missing steps {missing}, other value or timestamp at {wrong[:5]} "
                   f"(e.g. {[(got[s], steps[s]) for s in wrong[:2]]}), steps never logged {extra}")


def lost_create(server, d):
    """1: the first runs/create answer lost between server and tracker."""
    proxy = LostCreateProxy(server.port)
    try:
        project = os.path.join(d, "lost-create")
        steps = 20
        p = example(project, "lost-create", steps, proxy.uri, experiment="lost-create")
        if p.returncode != 0:
            h.fail(f"the run whose runs/create answer was lost exited {p.returncode}:\n{p.stderr[-3000:]}")
        if not proxy.dropped.is_set():
            h.fail(f"the proxy never threw a runs/create answer away (requests: {proxy.requests}): "
                   "the test tested nothing")
        creates = [r for r in proxy.requests if r.endswith("/runs/create")]
        after = proxy.requests[proxy.requests.index(creates[0]) + 1:]
        if len(creates) != 1 or not after or not after[0].endswith("/runs/search"):
            h.fail(f"after a lost runs/create answer the tracker sent {after[:3]}, and {len(creates)} runs/create "
                   f"in all (want one runs/search next, one runs/create in all)")
        if "runs/create" not in p.stderr or "answers again" not in p.stderr:
            h.fail(f"no warning about runs/create, or no line saying the server answers again:\n{p.stderr[-3000:]}")
        if journal_files(project):
            h.fail(f"a run whose records all reached the server left journals: {journal_files(project)}")
    finally:
        proxy.close()
    runs = read_runs(server.uri, "lost-create")
    if len(runs) != 1:
        h.fail(f"a lost runs/create answer left {len(runs)} runs: {[(r['name'], r['status']) for r in runs]} "
               "(want 1)")
    r = runs[0]
    if r["name"] != "lost-create" or r["status"] != "FINISHED" or not r["end_time"]:
        h.fail(f"lost runs/create answer: run {r['name']}, status {r['status']}, end_time {r['end_time']}")
    if proxy.lost_answer is None:
        h.fail("the proxy could not read the runs/create answer it threw away as JSON")
    if r["run_id"] != proxy.lost_answer["run"]["info"]["run_id"]:
        h.fail(f"lost runs/create answer: the run on the server is {r['run_id']}, not the one the lost answer "
               f"named ({proxy.lost_answer['run']['info']['run_id']})")
    if not r["tags"].get("hasten.run_token") or r["tags"].get("mlflow.source.type") != "LOCAL":
        h.fail(f"lost runs/create answer: tags {r['tags']}")
    for key in KEYS:
        got = sorted(s for s, _, _ in r["metrics"].get(key, []))
        if got != list(range(1, steps + 1)):
            h.fail(f"lost runs/create answer: metric {key} at steps {got} (want 1..{steps}, each once)")
    if [s for s, _, _ in r["metrics"].get("final_loss", [])] != [steps]:
        h.fail(f"lost runs/create answer: final_loss {r['metrics'].get('final_loss')}")


def dead_journals(server, d):
    """2: journals of processes killed by SIGKILL, replayed by the next run."""
    project = os.path.join(d, "dead")
    in_process = {"HASTEN_TRACKERS_IN_PROCESS": "true", "HASTEN_TEST_KILL_RANK": "0"}
    # "dead": its run made on the server, then the server killed; the process kills itself
    # (SIGKILL, right after logging step 40) while the server is away.
    kill_at = 40
    run = example(project, "dead", kill_at + 20, server.uri, background=True, delay_ms=150,
                  env={**in_process, "HASTEN_TEST_KILL_AT_STEP": str(kill_at)})
    try:
        deadline = time.time() + 40
        while server.logged_steps("hasten-example", "dead") < 3:
            if run.poll() is not None or time.time() > deadline:
                h.fail(f"run 'dead' logged no 3 steps to the server before it ended or 40 s passed:\n"
                       f"{run.communicate()[1][-3000:] if run.poll() is not None else ''}")
            time.sleep(0.1)
        server.kill()
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    if run.returncode != -signal.SIGKILL:
        h.fail(f"run 'dead' exited {run.returncode} (want SIGKILL at step {kill_at}):\n{err[-3000:]}")
    # "dead-offline": no server at all; killed right after logging step 5. Its start also
    # replays the journal of "dead", which the absent server cannot take.
    p = example(project, "dead-offline", 10, server.uri, env={**in_process, "HASTEN_TEST_KILL_AT_STEP": "5"})
    if p.returncode != -signal.SIGKILL:
        h.fail(f"run 'dead-offline' exited {p.returncode} (want SIGKILL at step 5):\n{p.stderr[-3000:]}")

    journals = {}
    for path in journal_files(project):
        if not path.endswith(".jsonl"):
            h.fail(f"{path} beside the journals of two killed runs")
        run_line, metrics, status = read_journal(path)
        journals[run_line["run_name"]] = (path, run_line, metrics)
        if status:
            h.fail(f"the journal of killed run {run_line['run_name']} has status lines {status}: nothing to test")
    if sorted(journals) != ["dead", "dead-offline"]:
        h.fail(f"journals of runs {sorted(journals)} (want 'dead' and 'dead-offline')")
    for name, last in (("dead", kill_at), ("dead-offline", 5)):
        for key in KEYS:
            if sorted(journals[name][2].get(key, {})) != list(range(1, last + 1)):
                h.fail(f"journal of {name}: {key} at steps {sorted(journals[name][2].get(key, {}))} "
                       f"(want 1..{last}: every step logged before the kill)")

    server.start()
    before = {r["name"]: r for r in read_runs(server.uri, "hasten-example")}
    if sorted(before) != ["dead"] or before["dead"]["status"] != "RUNNING":
        h.fail(f"before the replay the server holds {[(n, r['status']) for n, r in before.items()]} "
               "(want only 'dead', RUNNING)")
    if len(before["dead"]["metrics"].get("loss", [])) >= kill_at:
        h.fail("the server held every step of 'dead' before it was killed: the outage missed the run")

    p = example(project, "next", 3, server.uri)
    if p.returncode != 0:
        h.fail(f"the run after two killed ones exited {p.returncode}:\n{p.stderr[-3000:]}")
    for name, (path, _, _) in journals.items():
        if f"sending the records an earlier run left in {path}" not in p.stderr:
            h.fail(f"the next run did not name the journal of {name} ({path}):\n{p.stderr[-3000:]}")
    if "unreadable" in p.stderr or "did not reach" in p.stderr:
        h.fail(f"the replay did not send every record:\n{p.stderr[-3000:]}")
    left = journal_files(project)
    if left:
        h.fail(f"journals sent whole stay: {left}")

    runs = read_runs(server.uri, "hasten-example")
    by_name = {}
    for r in runs:
        by_name.setdefault(r["name"], []).append(r)
    if sorted((n, len(rs)) for n, rs in by_name.items()) != [("dead", 1), ("dead-offline", 1), ("next", 1)]:
        h.fail(f"after the replay the server holds runs {[(r['name'], r['status']) for r in runs]} "
               "(want 'dead', 'dead-offline' and 'next', one each)")
    if before["dead"]["run_id"] != by_name["dead"][0]["run_id"]:
        h.fail("the replay of 'dead' made a new run instead of finding the one its process made")
    for name, (path, run_line, metrics) in journals.items():
        r = by_name[name][0]
        last_ms = max(t for steps in metrics.values() for _, t in steps.values())
        if r["status"] != "FAILED" or r["end_time"] != last_ms:
            h.fail(f"replayed run {name}: status {r['status']}, end_time {r['end_time']} (want FAILED at its "
                   f"last record, {last_ms})")
        token = r["tags"].get("hasten.run_token")
        if r["start_time"] != run_line["start_time"] or token != run_line["hasten.run_token"]:
            h.fail(f"replayed run {name}: start_time {r['start_time']}, token {token} "
                   f"(its journal: {run_line['start_time']}, {run_line['hasten.run_token']})")
        check_metrics(f"replayed run {name}", r, metrics)
        if "final_loss" in r["metrics"]:
            h.fail(f"replayed run {name} has a final_loss its process never logged")
    r = by_name["next"][0]
    if r["status"] != "FINISHED" or sorted(s for s, _, _ in r["metrics"].get("loss", [])) != [1, 2, 3]:
        h.fail(f"the run that sent the journals: status {r['status']}, loss {r['metrics'].get('loss')}")


with tempfile.TemporaryDirectory() as d:
    server = Server(d)
    try:
        t0 = time.time()
        server.start()
        t1 = time.time()
        lost_create(server, d)
        t2 = time.time()
        dead_journals(server, d)
        t3 = time.time()
    finally:
        server.kill()
print(f"server start {t1 - t0:.1f} s, lost runs/create {t2 - t1:.1f} s, journals of killed runs {t3 - t2:.1f} s")
print("mlflow edges: OK")
