"""hasten-fashion-mnist learns on the real data set, and its evaluation is exact across
processes:
- 2 processes (ddp), a few hundred steps: test accuracy far above chance (10%), the gathered
  evaluation counting each of the 10,000 test images once (eval_count exactly 10000, with an
  evaluation batch that leaves padding in the last round);
- the same run on 1 process (the same global batch: 2 x 64 = 1 x 128, the same data order)
  and on 2 processes under zero3 reach the same accuracy within 1 point;
- --resume after the last epoch continues from the checkpoint the run saved.
Skips (exit 77) when Debian's dataset-fashion-mnist is not installed; scripts/install-deps.sh
installs it."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
         "t10k-labels-idx1-ubyte.gz"]
if not all(os.path.isfile(os.path.join(DATA, f)) for f in FILES):
    print(f"SKIP: Fashion-MNIST is not installed in {DATA} (apt-get install dataset-fashion-mnist)")
    sys.exit(77)

STEPS = 200
# 10,000 / (2 x 192) leaves a last round of 16 real images and 368 padding ones: counted once
# only if gather_for_metrics drops the padding.
COMMON = ["--epochs", "1", "--max_steps", str(STEPS), "--eval_batch_size", "192", "--json"]


def program(*args):
    return [os.path.join(h.BIN, "hasten-fashion-mnist"), *args]


def summary(p, what):
    for line in p.stdout.splitlines():
        line = line.removeprefix("[rank 0] ")  # hasten launch prefixes each rank's output
        if line.startswith("{"):
            return json.loads(line)
    h.fail(f"{what}: no JSON summary in the output:\n{p.stdout}\n{p.stderr}")


def launch2(strategy, project_dir, *extra):
    cmd = h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", "--strategy", strategy,
                   *program(*COMMON, "--batch_size", "64", "--project_dir", project_dir, *extra))
    return summary(h.run(cmd, check=True), f"2 processes, {strategy}")


with tempfile.TemporaryDirectory() as tmp:
    ddp = launch2("ddp", os.path.join(tmp, "ddp"))
    print(f"ddp x2: {ddp}")
    if ddp["eval_count"] != 10000:
        h.fail(f"2 processes evaluated {ddp['eval_count']} test images, expected exactly 10000")
    if ddp["num_processes"] != 2 or ddp["steps"] != STEPS:
        h.fail(f"2-process run: expected 2 processes and {STEPS} steps: {ddp}")
    if not ddp["test_accuracy"] > 0.6:
        h.fail(f"after {STEPS} steps the test accuracy is {ddp['test_accuracy']}: no learning (chance is 0.1)")
    if not os.path.isfile(os.path.join(ddp["checkpoint"], "manifest.json")):
        h.fail(f"no complete checkpoint at {ddp['checkpoint']}")

    single = summary(h.run(program(*COMMON, "--batch_size", "128", "--project_dir", os.path.join(tmp, "one")),
                           check=True), "1 process")
    print(f"single: {single}")
    if single["eval_count"] != 10000:
        h.fail(f"1 process evaluated {single['eval_count']} test images, expected 10000")

    zero3 = launch2("zero3", os.path.join(tmp, "zero3"))
    print(f"zero3 x2: {zero3}")
    if zero3["eval_count"] != 10000 or zero3["strategy"] != "zero":  # the plugin behind the zero3 preset
        h.fail(f"zero3 run: expected 10000 images under zero3: {zero3}")

    for name, other in (("1 process", single), ("zero3 on 2 processes", zero3)):
        diff = abs(other["test_accuracy"] - ddp["test_accuracy"])
        if diff > 0.01:
            h.fail(f"{name} reached {other['test_accuracy']:.4f}, ddp on 2 processes {ddp['test_accuracy']:.4f}: "
                   f"{diff:.4f} apart, more than 0.01")

    # The run stopped at its last (only) epoch: --resume finds the checkpoint, trains nothing
    # more and evaluates the restored weights to the same accuracy.
    again = launch2("ddp", os.path.join(tmp, "ddp"), "--resume")
    if not again["resumed_from"] or again["steps"] != STEPS or again["epochs"] != 1:
        h.fail(f"--resume did not continue from the saved checkpoint: {again}")
    if abs(again["test_accuracy"] - ddp["test_accuracy"]) > 1e-9:
        h.fail(f"resumed weights evaluate to {again['test_accuracy']}, the run ended at {ddp['test_accuracy']}")

    # A signal to one rank (SIGTERM: scancel, a launcher's stop; here to rank 1 only): the loop
    # asks acc.stop_requested() each step, every rank stops at the same step, a final
    # checkpoint is saved mid-epoch and the run returns 0; --resume continues from it.
    project = os.path.join(tmp, "stopped")
    cmd = h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", "--strategy", "ddp",
                   *program("--epochs", "50", "--batch_size", "64", "--json", "--project_dir", project))
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def workers():
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == launcher.pid:  # the parent pid
                found.append(int(pid))
        return sorted(found)
    deadline = time.monotonic() + 120
    while len(workers()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # past the set-up: training
    os.kill(workers()[-1], signal.SIGTERM)
    out, err = launcher.communicate(timeout=300)
    if launcher.returncode != 0:
        h.fail(f"a run stopped by SIGTERM exited {launcher.returncode}:\n{err}")
    stopped = summary(subprocess.CompletedProcess([], 0, out, err), "stopped by SIGTERM")
    if not stopped["stopped"] or not stopped["checkpoint"] or stopped["steps"] <= 0 or stopped["epochs"] != 0:
        h.fail(f"SIGTERM to rank 1: {stopped}")
    if not os.path.isfile(os.path.join(stopped["checkpoint"], "manifest.json")):
        h.fail(f"the final checkpoint {stopped['checkpoint']} is not complete")
    print(f"ok: SIGTERM to rank 1 stopped both ranks at step {stopped['steps']}, saved {stopped['checkpoint']}")
    more = summary(h.run(h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", "--strategy", "ddp",
                                  *program("--epochs", "50", "--batch_size", "64", "--json", "--project_dir", project,
                                           "--resume", "--max_steps", str(stopped["steps"] + 5))), check=True),
                   "resumed")
    if more["resumed_from"] != stopped["checkpoint"] or more["steps"] != stopped["steps"] + 5 or more["stopped"]:
        h.fail(f"--resume after the stop: {more}")
    print(f"ok: --resume continued from step {stopped['steps']} to {more['steps']}")
print("ok")
