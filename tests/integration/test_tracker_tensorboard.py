"""Tracker tensorboard: the event files decode with a reader built from protobuf and the
project's .proto subset, every CRC checks, and the logged scalars (a NaN and an inf among
them), the text and the HParams session come back; a corrupted byte is caught; a second run
gets its own run directory; a run that ends by an error is a failed session; buffered records
reach the disk after flush_secs while the run is idle (no log call)."""
import glob
import json
import math
import os
import subprocess
import tempfile
import time

import harness as h
import tfevents

event_pb2, hparams_pb2 = tfevents.load_modules()
WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")


def run(logs, *args):
    return h.run([WORKER, *args], env={"HASTEN_LOG_WITH": "tensorboard", "HASTEN_LOGGING_DIR": logs})


def run_dirs(logs):
    return sorted(glob.glob(os.path.join(logs, "trk", "tensorboard", "*")))


def read_run(run_dir):
    files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    if len(files) != 1:
        h.fail(f"{run_dir}: expected one event file, found {files}")
    name = os.path.basename(files[0]).split(".")
    if len(name) < 5 or not name[3].isdigit() or len(name[3]) != 10:
        h.fail(f"event file name {files[0]} is not events.out.tfevents.<%010d seconds>.<host>")
    return files[0], tfevents.events(files[0], event_pb2)


def hparams_data(evs, tag):
    found = []
    for e in evs:
        for v in e.summary.value:
            if v.tag == tag:
                if v.metadata.plugin_data.plugin_name != "hparams":
                    h.fail(f"{tag}: plugin_name {v.metadata.plugin_data.plugin_name!r}, expected 'hparams'")
                d = hparams_pb2.HParamsPluginData()
                d.ParseFromString(v.metadata.plugin_data.content)
                found.append(d)
    if len(found) != 1:
        h.fail(f"expected one {tag} record, found {len(found)}")
    return found[0]


with tempfile.TemporaryDirectory() as logs:
    p = run(logs)
    if p.returncode != 0:
        h.fail(f"tracker run exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    dirs = run_dirs(logs)
    if len(dirs) != 1:
        h.fail(f"expected one run directory under {logs}/trk/tensorboard, found {dirs}")
    path, evs = read_run(dirs[0])
    if evs[0].file_version != "brain.Event:2" or evs[0].wall_time <= 0:
        h.fail(f"first record is not the brain.Event:2 header: {evs[0]}")

    scalars = {}
    texts = []
    for e in evs[1:]:
        for v in e.summary.value:
            if v.WhichOneof("value") == "simple_value":
                scalars.setdefault(v.tag, []).append((e.step, v.simple_value))
            elif v.metadata.plugin_data.plugin_name == "text":
                texts.append((e.step, v.tag, v.tensor))
    want_loss = [(1, 1.0), (2, 0.5), (3, math.nan), (4, 0.25), (5, 0.2)]
    want_acc = [(s, s / 10.0) for s in range(1, 6)]
    want_acc[3] = (4, math.inf)
    for tag, want in [("loss", want_loss), ("acc", want_acc)]:
        got = scalars.get(tag, [])
        if len(got) != len(want):
            h.fail(f"scalar {tag}: {got}, expected {want}")
        for (gs, gv), (ws, wv) in zip(got, want):
            same = (math.isnan(gv) and math.isnan(wv)) or gv == wv or abs(gv - wv) < 1e-6 * abs(wv)
            if gs != ws or not same:
                h.fail(f"scalar {tag}: {got}, expected {want} (float32)")
    if len(texts) != 1:
        h.fail(f"expected one text record, found {texts}")
    step, tag, tensor = texts[0]
    if (step, tag) != (2, "notes") or tensor.dtype != 7:  # TensorFlow's DT_STRING
        h.fail(f"text record at step {step} tag {tag!r} dtype {tensor.dtype}")
    if list(tensor.string_val) != [b"hello **tracker**"] or [d.size for d in tensor.tensor_shape.dim] != [1]:
        h.fail(f"text tensor: {tensor}")

    start = hparams_data(evs, "_hparams_/session_start_info").session_start_info
    got = {k: start.hparams[k].WhichOneof("kind") for k in start.hparams}
    if got != {"lr": "number_value", "model": "string_value", "layers": "number_value", "bf16": "bool_value"}:
        h.fail(f"hparams kinds: {got}")
    if (start.hparams["lr"].number_value, start.hparams["model"].string_value, start.hparams["layers"].number_value,
            start.hparams["bf16"].bool_value) != (0.001, "mlp", 3.0, False):
        h.fail(f"hparams values: {start.hparams}")
    end = hparams_data(evs, "_hparams_/session_end_info").session_end_info
    if end.status != hparams_pb2.STATUS_SUCCESS or end.end_time_secs < start.start_time_secs:
        h.fail(f"session end: {end}")

    # The reader catches a flipped byte: the CRCs are really checked.
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x01
    bad = os.path.join(logs, "corrupt.tfevents")
    with open(bad, "wb") as f:
        f.write(data)
    try:
        tfevents.records(bad)
        h.fail("a corrupted event file passed the CRC checks")
    except ValueError as e:
        print(f"corruption caught: {e}")

    # A second init_trackers run is a run directory of its own; ending by an error is a failed session.
    p = run(logs, "--fail")
    if p.returncode != 1 or "injected failure" not in p.stderr:
        h.fail(f"failing run exited {p.returncode}:\n{p.stderr}")
    dirs = run_dirs(logs)
    if len(dirs) != 2:
        h.fail(f"expected two run directories after two runs, found {dirs}")
    failed = [d for d in dirs if hparams_data(read_run(d)[1], "_hparams_/session_end_info").session_end_info.status
              == hparams_pb2.STATUS_FAILURE]
    if len(failed) != 1:
        h.fail(f"expected one failed session among {dirs}")

# The flush timer: with a queue far longer than the run, the last steps reach the disk only
# because flush_secs passed, while the program waits idle before end_training.
with tempfile.TemporaryDirectory() as logs:
    release = os.path.join(logs, "release")
    env = dict(os.environ, HASTEN_LOG_WITH="tensorboard", HASTEN_LOGGING_DIR=logs,
               HASTEN_TRACKER_OPTIONS=json.dumps({"tensorboard": {"flush_secs": 1, "max_queue": 1000}}))
    proc = subprocess.Popen([WORKER, "--hold", release], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        if proc.stdout.readline().strip() != "trackers: holding":
            h.fail(f"--hold: the program did not reach its idle wait:\n{proc.stderr.read()}")
        steps = []
        deadline = time.monotonic() + 120  # generous: only a missing flush should reach it
        while time.monotonic() < deadline:
            files = glob.glob(os.path.join(logs, "trk", "tensorboard", "*", "events.out.tfevents.*"))
            try:
                evs = tfevents.events(files[0], event_pb2) if len(files) == 1 else []
            except ValueError:
                evs = []  # read while a record was being written
            steps = sorted({e.step for e in evs for v in e.summary.value if v.tag == "loss"})
            if steps == [1, 2, 3, 4, 5]:
                break
            time.sleep(0.2)
        if steps != [1, 2, 3, 4, 5]:
            h.fail(f"flush_secs: the idle run's file holds loss steps {steps}, expected [1, 2, 3, 4, 5] on disk")
    finally:
        open(release, "w").close()
        out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        h.fail(f"--hold run exited {proc.returncode}:\n{err}")
print("tracker tensorboard: OK")
