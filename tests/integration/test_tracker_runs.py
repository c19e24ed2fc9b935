"""Two runs with the csv and jsonl trackers in one logging directory: the second never destroys
the first's data (csv: metrics.csv then metrics-1.csv, with hparams.json and hparams-1.json;
jsonl: appended)."""
import os
import tempfile

import harness as h

with tempfile.TemporaryDirectory() as d:
    env = {"HASTEN_HOME": os.path.join(d, "home")}
    cmd = h.example("--steps", "3", "--warmup", "0", "--log-every", "1", "--trackers", "csv", "jsonl",
                    "--project", "p", "--project_dir", d)
    logs = os.path.join(d, "hasten_logs", "p")
    h.run(cmd, env=env, check=True)
    with open(os.path.join(logs, "metrics.csv")) as f:
        first = f.read()
    if first.count("\n") < 2:
        h.fail("the first run logged no rows:\n" + first)
    h.run(cmd, env=env, check=True)
    with open(os.path.join(logs, "metrics.csv")) as f:
        if f.read() != first:
            h.fail("the second run changed the first run's metrics.csv")
    for name in ("metrics-1.csv", "hparams.json", "hparams-1.json"):
        if not os.path.exists(os.path.join(logs, name)):
            h.fail(f"no {name} after two runs: {sorted(os.listdir(logs))}")
    with open(os.path.join(logs, "metrics-1.csv")) as f:
        if f.read().count("\n") != first.count("\n"):
            h.fail("the second run's metrics-1.csv differs in length from the first run's")
    print("ok: csv keeps each run: " + " ".join(sorted(os.listdir(logs))))
print("tracker runs: OK")
