"""Two runs with the csv and jsonl trackers in one logging directory: the second never destroys
the first's data (csv: metrics.csv then metrics-1.csv, with hparams.json and hparams-1.json;
jsonl: appended). A kill (SIGKILL, test builds' HASTEN_TEST_CRASH_AT) in the middle of the csv
file's rewrite for a new column leaves the rows written before it, or the new file whole."""
import csv
import glob
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

# hasten-test-trackers --widen logs loss and acc at steps 1..5 (the csv file is rewritten at
# step 1: its second rewrite, after the one at the start), then extra at step 6 (the third).
TRACKERS = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")
for point, want_steps, want_header in (("csv-rewrite-written:3", 5, ["step", "acc", "loss"]),
                                       ("csv-rewrite-renamed:3", 6, ["step", "acc", "extra", "loss"]),
                                       ("", 6, ["step", "acc", "extra", "loss"])):
    with tempfile.TemporaryDirectory() as d:
        env = {"HASTEN_HOME": os.path.join(d, "home"), "HASTEN_LOG_WITH": "csv", "HASTEN_LOGGING_DIR": d,
               "HASTEN_TEST_CRASH_AT": point}
        p = h.run([TRACKERS, "--widen"], env=env)
        if point and "SIGKILL" not in p.stderr:
            h.fail(f"the tracker killed at {point} went unnoticed:\n{p.stdout}\n{p.stderr}")
        if not point and p.returncode != 0:
            h.fail(f"the --widen run failed:\n{p.stderr}")
        found = glob.glob(os.path.join(d, "**", "metrics.csv"), recursive=True)
        if len(found) != 1:
            h.fail(f"after a kill at {point or 'no point'}: metrics.csv files {found}")
        with open(found[0]) as f:
            rows = list(csv.reader(f))
        steps = [int(r[0]) for r in rows[1:]]
        if rows[0] != want_header or steps != list(range(1, want_steps + 1)):
            h.fail(f"after a kill at {point or 'no point'} metrics.csv holds {rows}")
        print(f"ok: csv {('killed at ' + point) if point else 'not killed'}: metrics.csv whole, "
              f"header {rows[0]}, steps 1..{want_steps}")
print("tracker runs: OK")
