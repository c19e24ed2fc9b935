"""scripts/fashion_mnist_torch.py, the PyTorch peer of hasten-fashion-mnist in `make bench`,
trains the same thing hasten does: the same initial weights, data order (shuffle, per-rank
slices), Adam and cosine schedule. If any of them differed, the test loss after a few steps
would differ in the second or third digit; equal, it agrees to float rounding.
- 1 process, 20 steps: hasten-fashion-mnist against the script;
- 2 processes, 30 steps: hasten launch (ddp) against the script's DistributedDataParallel;
- the script's bad input and a missing data set: one clear line, non-zero exit.
Skips (exit 77) when Debian's dataset-fashion-mnist is not installed."""
import json
import os
import sys
import tempfile

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
         "t10k-labels-idx1-ubyte.gz"]
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "fashion_mnist_torch.py")
# Float rounding (another reduction order in DDP's all-reduce, LibTorch's C++ Adam against
# PyTorch's) moves the test loss by about 1e-8 here; a different weight, sample or lr by 1e-3
# and more.
LOSS_TOLERANCE = 1e-5


def summary(p, what):
    for line in p.stdout.splitlines():
        line = line.removeprefix("[rank 0] ")
        if line.startswith("{"):
            return json.loads(line)
    h.fail(f"{what}: no JSON summary in the output:\n{p.stdout}\n{p.stderr}")


def torch_side(*args):
    return [h.PYTHON, SCRIPT, *args]


for bad, expect in ((["--epochs", "0"], "--epochs"), (["--lr", "0"], "--lr"), (["--max_steps", "x"], "--max_steps"),
                    (["--bogus"], "--bogus")):
    h.check_clean_failure(h.run(torch_side(*bad)), f"fashion_mnist_torch.py {' '.join(bad)}", expect)
with tempfile.TemporaryDirectory() as empty:
    h.check_clean_failure(h.run(torch_side("--data_dir", empty)), "fashion_mnist_torch.py with no data set",
                          "dataset-fashion-mnist")

if not all(os.path.isfile(os.path.join(DATA, f)) for f in FILES):
    print(f"SKIP: Fashion-MNIST is not installed in {DATA} (apt-get install dataset-fashion-mnist)")
    sys.exit(77)


def compare(what, hasten_run, torch_run, steps):
    print(f"{what}: hasten {hasten_run}\n{what}: torch  {torch_run}")
    for run in (hasten_run, torch_run):
        if run["steps"] != steps or run["eval_count"] != 10000:
            h.fail(f"{what}: expected {steps} steps and 10000 test images: {run}")
    diff = abs(hasten_run["test_loss"] - torch_run["test_loss"])
    if diff > LOSS_TOLERANCE:
        h.fail(f"{what}: test loss {hasten_run['test_loss']!r} (hasten) vs {torch_run['test_loss']!r} (PyTorch), "
               f"{diff:.3g} apart: not the same training (weights, data order or optimizer differ)")
    if abs(hasten_run["test_accuracy"] - torch_run["test_accuracy"]) > 0.0005:
        h.fail(f"{what}: test accuracy {hasten_run['test_accuracy']} (hasten) vs {torch_run['test_accuracy']} (PyTorch)")


with tempfile.TemporaryDirectory() as tmp:
    common = ["--epochs", "1", "--json"]
    one = ["--max_steps", "20", *common]
    compare("1 process",
            summary(h.run([os.path.join(h.BIN, "hasten-fashion-mnist"), *one, "--project_dir",
                           os.path.join(tmp, "one")], check=True), "hasten, 1 process"),
            summary(h.run(torch_side(*one), check=True), "PyTorch, 1 process"), 20)
    two = ["--max_steps", "30", *common]
    compare("2 processes",
            summary(h.run(h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", "--strategy", "ddp",
                                   os.path.join(h.BIN, "hasten-fashion-mnist"), *two, "--quiet", "--project_dir",
                                   os.path.join(tmp, "two")), check=True), "hasten ddp, 2 processes"),
            summary(h.run(torch_side(*two, "--num_processes", "2"), check=True), "PyTorch DDP, 2 processes"), 30)
print("ok")
