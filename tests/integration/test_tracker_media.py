"""Tracker tensorboard beyond scalars, read back by TensorBoard's own EventAccumulator and
checked against PyTorch's SummaryWriter writing the same values in this test:

- images (float CHW, uint8 HW, uint8 HWC RGBA): the PNG pixels SummaryWriter.add_image makes;
- histograms: SummaryWriter.add_histogram's buckets and limits exactly, min/max/num/sum (a
  NaN among the values is left out, with a warning);
- a table: markdown text for the text plugin;
- hparams: the HParams plugin's session start (the run's hyperparameters) and end (success),
  with the run's scalars as its metrics;
in a tracker host process (the default) and in the training process. A tracker that keeps no
images (csv) is named once; a bad image is one line and a non-zero exit. init_trackers's
init_kwargs override tracker_options; a bad one is one line."""
import io
import os
import subprocess
import tempfile

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from torch.utils.tensorboard import SummaryWriter
import torch

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-trackers")


def expected(step):
    """The worker's values (tracker_run.cpp, --media) and SummaryWriter's files of them."""
    rgb = torch.arange(3 * 6 * 8, dtype=torch.float32).reshape(3, 6, 8) / 143.0
    grey = (torch.arange(6).reshape(6, 1) * 30 + torch.arange(8).reshape(1, 8)).to(torch.uint8)
    rgba = ((torch.arange(5).reshape(5, 1, 1) * 12 + torch.arange(6).reshape(1, 6, 1) * 4 +
             torch.arange(4).reshape(1, 1, 4)) * 3).to(torch.uint8)
    weights = torch.linspace(-2, 3, 1001, dtype=torch.float64) * step
    return {"rgb": (rgb, "CHW"), "grey": (grey, "HW"), "rgba": (rgba, "HWC")}, {
        "weights": weights.numpy(), "counts": np.arange(100, dtype=np.float64),
        "outliers": np.array([1e25, 1.0, -3e21, 0.5])}


def accumulate(run_dir):
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={"images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def reference(d):
    """SummaryWriter's event file of the same images and histograms."""
    w = SummaryWriter(os.path.join(d, "reference"))
    for step in (1, 2):
        images, hists = expected(step)
        for tag, (img, fmt) in images.items():
            w.add_image(tag, img, step, dataformats=fmt)
        for tag, values in hists.items():
            w.add_histogram(tag, values, step, bins="tensorflow")
    w.close()
    return accumulate(os.path.join(d, "reference"))


def pixels(encoded, mode):
    return np.asarray(Image.open(io.BytesIO(encoded)).convert(mode))


def check_run(run_dir, ref, what):
    acc = accumulate(run_dir)
    tags = acc.Tags()
    for kind, want in (("images", ["grey", "rgb", "rgba"]), ("histograms", ["counts", "outliers", "weights"])):
        if sorted(tags[kind]) != want:
            h.fail(f"{what}: {kind} tags {tags[kind]} (want {want})")
    for tag in ("rgb", "grey", "rgba"):
        ours, theirs = acc.Images(tag), ref.Images(tag)
        if [e.step for e in ours] != [1, 2]:
            h.fail(f"{what}: image {tag} at steps {[e.step for e in ours]}")
        mode = "RGBA" if tag == "rgba" else "RGB"
        for a, b in zip(ours, theirs):
            pa, pb = pixels(a.encoded_image_string, mode), pixels(b.encoded_image_string, mode)
            # The PNG's own colour type (SummaryWriter writes grey as RGB; hasten keeps it grey).
            png_mode = Image.open(io.BytesIO(a.encoded_image_string)).mode
            if png_mode != {"rgb": "RGB", "grey": "L", "rgba": "RGBA"}[tag]:
                h.fail(f"{what}: image {tag} step {a.step} is a PNG of mode {png_mode}")
            if (a.width, a.height) != (b.width, b.height) or not np.array_equal(pa, pb):
                h.fail(f"{what}: image {tag} step {a.step}: {a.width}x{a.height} vs SummaryWriter's "
                       f"{b.width}x{b.height}, {int((pa != pb).sum()) if pa.shape == pb.shape else 'shape'} pixels differ")
    for tag in ("weights", "counts", "outliers"):
        ours, theirs = acc.Histograms(tag), ref.Histograms(tag)
        if [e.step for e in ours] != [1, 2]:
            h.fail(f"{what}: histogram {tag} at steps {[e.step for e in ours]}")
        for a, b in zip(ours, theirs):
            x, y = a.histogram_value, b.histogram_value
            if list(x.bucket_limit) != list(y.bucket_limit) or list(x.bucket) != list(y.bucket):
                h.fail(f"{what}: histogram {tag} step {a.step}: {len(x.bucket)} buckets vs SummaryWriter's "
                       f"{len(y.bucket)}; first limits {list(x.bucket_limit)[:3]} vs {list(y.bucket_limit)[:3]}")
            for field in ("min", "max", "num", "sum", "sum_squares"):
                u, v = getattr(x, field), getattr(y, field)
                if abs(u - v) > 1e-9 * max(1.0, abs(v)):
                    h.fail(f"{what}: histogram {tag} step {a.step}: {field} {u} vs SummaryWriter's {v}")
    table = acc.Tensors("samples")
    if [e.step for e in table] != [1, 2]:
        h.fail(f"{what}: table at steps {[e.step for e in table]}")
    text = table[0].tensor_proto.string_val[0].decode()
    want = "| id | text | score |\n| --- | --- | --- |\n| 1.0 | a\\|b | 0.5 |\n| 2.0 | c | -1.0 |\n"
    if text != want:
        h.fail(f"{what}: table text {text!r} (want {want!r})")
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    got = {k: (v.number_value if v.HasField("number_value") else v.string_value if v.HasField("string_value")
               else v.bool_value) for k, v in start.hparams.items()}
    if got != {"lr": 0.001, "model": "mlp", "layers": 3.0, "bf16": False}:
        h.fail(f"{what}: hparams {got}")
    end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"]).session_end_info
    if end.status != 1:  # STATUS_SUCCESS
        h.fail(f"{what}: session end status {end.status}")
    if [round(e.value, 6) for e in acc.Scalars("loss")] != [1.0, 0.5]:
        h.fail(f"{what}: the run's metric loss {acc.Scalars('loss')}")


with tempfile.TemporaryDirectory() as d:
    ref = reference(d)
    for mode, extra in (("tracker host process", {}), ("training process", {"HASTEN_TRACKERS_IN_PROCESS": "true"})):
        logs = os.path.join(d, mode.replace(" ", "-"))
        env = {"HASTEN_LOG_WITH": "tensorboard,csv", "HASTEN_LOGGING_DIR": logs, **extra}
        p = h.run([WORKER, "--media"], env=env)
        if p.returncode != 0:
            h.fail(f"{mode}: worker exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        runs = os.listdir(os.path.join(logs, "trk", "tensorboard"))
        check_run(os.path.join(logs, "trk", "tensorboard", runs[0]), ref, mode)
        for kind, call in (("images", "log_images"), ("histograms", "log_histogram"), ("tables", "log_table"),
                           ("text", "log_text")):
            line = f"tracker 'csv' keeps no {kind}: {call} skips it (said once)"
            if p.stderr.count(line) != 1:
                h.fail(f"{mode}: {p.stderr.count(line)} lines {line!r} (want 1):\n{p.stderr}")
        if p.stderr.count("holds 1 NaN or infinite values of 1002") != 2:
            h.fail(f"{mode}: no warning for the NaN of each weights histogram:\n{p.stderr}")
        if p.stderr.count("log_histogram: 'nothing' has no finite values; no histogram is logged") != 2:
            h.fail(f"{mode}: no warning for the histogram without finite values:\n{p.stderr}")
    # init_kwargs: a tracker's options for this run, over its tracker_options key by key.
    logs = os.path.join(d, "kwargs")
    env = {"HASTEN_LOG_WITH": "tensorboard", "HASTEN_LOGGING_DIR": logs,
           "HASTEN_TRACKER_OPTIONS": "{tensorboard: {run_name: from-config, max_queue: 3}}"}
    p = h.run([WORKER, "--init-kwargs", "tensorboard={run_name: from-kwargs}"], env=env)
    if p.returncode != 0 or os.listdir(os.path.join(logs, "trk", "tensorboard")) != ["from-kwargs"]:
        h.fail(f"init_kwargs run_name: exit {p.returncode}, runs "
               f"{os.listdir(os.path.join(logs, 'trk', 'tensorboard')) if p.returncode == 0 else p.stderr}")
    bad = h.run([WORKER, "--init-kwargs", "tensorbord={run_name: x}"], env=env)
    h.check_clean_failure(bad, "init_kwargs for no tracker", "init_trackers: init_kwargs names 'tensorbord', which is not "
                          "a configured tracker (trackers: tensorboard); did you mean 'tensorboard'?")
    bad = h.run([WORKER, "--init-kwargs", "tensorboard=[1, 2]"], env=env)
    h.check_clean_failure(bad, "init_kwargs not a mapping", "init_kwargs['tensorboard'] is [1, 2] (allowed: a mapping")
    bad = h.run([WORKER, "--init-kwargs", "tensorboard={max_queue: 0}"], env=env)
    h.check_clean_failure(bad, "init_kwargs with a bad option", "max_queue")
    bad = h.run([WORKER, "--bad-image"], env={"HASTEN_LOG_WITH": "tensorboard", "HASTEN_LOGGING_DIR": d})
    h.check_clean_failure(bad, "a [5, 4, 6] image",
                          "log_images: image 'bad' has shape [5, 4, 6]: neither [C, H, W] nor [H, W, C] with C 1, 3 or 4")
print("tracker media: OK")
