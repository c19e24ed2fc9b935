"""A real `mlflow server` for the tracker tests (test_mlflow_server.py, test_mlflow_edges.py): on a
SQLite database in a directory, started on a loopback port, killed with SIGKILL, started again."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import harness as h

MLFLOW = os.path.join(os.environ["HASTEN_TEST_SERVICES_VENV"], "bin", "mlflow")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """mlflow server on a SQLite database in root (on `port`, else a free one)."""

    def __init__(self, root, port=None):
        port = port or free_port()
        self.root, self.port, self.proc = root, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self, artifacts="proxy"):
        """artifacts "proxy": the server stores them (--artifacts-destination, its artifact
        proxy, what a team's server does); "local": clients write them to a directory
        (--no-serve-artifacts --default-artifact-root), applied to experiments made then."""
        log = open(os.path.join(self.root, "server.log"), "a")
        where = ["--artifacts-destination", f"{self.root}/artifacts"] if artifacts == "proxy" else \
            ["--no-serve-artifacts", "--default-artifact-root", f"{self.root}/local-artifacts"]
        self.proc = subprocess.Popen(
            [MLFLOW, "server", "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db", *where,
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                h.fail(f"mlflow server exited {self.proc.returncode}; log {self.root}/server.log")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        h.fail(f"mlflow server did not answer on {self.uri} within 120 s; log {self.root}/server.log")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def logged_steps(self, experiment, run_name):
        """Steps of `loss` the server holds for the run, through the REST API (no client)."""
        def post(endpoint, body):
            req = urllib.request.Request(f"{self.uri}/api/2.0/mlflow/{endpoint}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.load(r)
        try:
            with urllib.request.urlopen(f"{self.uri}/api/2.0/mlflow/experiments/get-by-name?experiment_name="
                                        f"{experiment}", timeout=5) as r:
                eid = json.load(r)["experiment"]["experiment_id"]
            runs = post("runs/search", {"experiment_ids": [eid],
                                        "filter": f"tags.`mlflow.runName` = '{run_name}'"}).get("runs", [])
            for m in runs[0]["data"].get("metrics", []) if runs else []:
                if m["key"] == "loss":
                    return m["step"]
        except (OSError, KeyError, IndexError):
            pass
        return 0
