"""hasten-fashion-mnist --log_samples N shows the trackers what the model sees and guesses,
read back by TensorBoard's own EventAccumulator:
- after each epoch an image `test_samples`: the first N test images side by side, whose pixels
  are the data set's own bytes (min-max scaled over the strip, as the example documents);
- a table `test_guesses` at the same steps: one row per image, its true label (from the data
  set's label file), the model's guess (a class name) and whether they agree;
- under zero3 on 2 processes (every rank runs the forward that gathers the shards) the run ends
  and the main process logs the strip once;
- --log_samples outside 0..64 is refused with one line.
Skips (exit 77) when Debian's dataset-fashion-mnist is not installed."""
import gzip
import io
import os
import sys
import tempfile

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
if not all(os.path.isfile(os.path.join(DATA, f)) for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")):
    print(f"SKIP: Fashion-MNIST is not installed in {DATA} (apt-get install dataset-fashion-mnist)")
    sys.exit(77)

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
N = 8


def idx(name, header):
    with gzip.open(os.path.join(DATA, name)) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)


labels = idx("t10k-labels-idx1-ubyte.gz", 8)[:N]
raw = idx("t10k-images-idx3-ubyte.gz", 16)[: N * 784].reshape(N, 28, 28).astype(np.float64)
strip = np.concatenate(list(raw), axis=1)
want_pixels = (strip - strip.min()) / (strip.max() - strip.min()) * 255.0


def program(*args):
    return [os.path.join(h.BIN, "hasten-fashion-mnist"), "--quiet", *args]


def events(project_dir):
    root = os.path.join(project_dir, "hasten_logs", "fashion-mnist", "tensorboard")
    runs = os.listdir(root)
    if len(runs) != 1:
        h.fail(f"expected one tensorboard run under {root}, found {runs}")
    acc = event_accumulator.EventAccumulator(os.path.join(root, runs[0]),
                                             size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    return acc


def check_samples(acc, steps, what):
    images = acc.Images("test_samples")
    if [e.step for e in images] != steps:
        h.fail(f"{what}: test_samples at steps {[e.step for e in images]} (want {steps})")
    for e in images:
        if (e.width, e.height) != (28 * N, 28):
            h.fail(f"{what}: test_samples is {e.width}x{e.height}, want {28 * N}x28")
        got = np.asarray(Image.open(io.BytesIO(e.encoded_image_string)).convert("L")).astype(np.float64)
        worst = np.abs(got - want_pixels).max()
        if worst > 1.0:
            h.fail(f"{what}: test_samples pixels differ from the data set's by up to {worst} (of 255)")
    tables = acc.Tensors("test_guesses")
    if [e.step for e in tables] != steps:
        h.fail(f"{what}: test_guesses at steps {[e.step for e in tables]} (want {steps})")
    for e in tables:
        lines = e.tensor_proto.string_val[0].decode().splitlines()
        if lines[0] != "| image | label | guess | right |" or len(lines) != 2 + N:
            h.fail(f"{what}: test_guesses is not a table of {N} rows:\n" + "\n".join(lines))
        right = 0
        for i, line in enumerate(lines[2:]):
            image, label, guess, ok = [c.strip() for c in line.strip("|").split("|")]
            if image != str(i) or label != CLASSES[labels[i]]:
                h.fail(f"{what}: row {i} is image {image} labelled {label!r}, want {i} {CLASSES[labels[i]]!r}")
            if guess not in CLASSES or ok != ("yes" if guess == label else "no"):
                h.fail(f"{what}: row {i} has guess {guess!r} and right {ok!r}")
            right += ok == "yes"
        print(f"{what}: step {e.step}: {right}/{N} guessed right")
    return right


with tempfile.TemporaryDirectory() as tmp:
    # 60,000 / 2,000 = 30 steps per epoch: two epochs, two strips.
    one = os.path.join(tmp, "one")
    h.run(program("--epochs", "2", "--batch_size", "2000", "--threads", "2", "--log_samples", str(N),
                  "--log_with", "tensorboard", "--project_dir", one), check=True, timeout=600)
    right = check_samples(events(one), [30, 60], "1 process")
    if right < N // 2:
        h.fail(f"after 2 epochs only {right}/{N} sample images are guessed right: the guesses are not the model's")

    two = os.path.join(tmp, "two")
    h.run(h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", "--strategy", "zero3",
                   *program("--epochs", "1", "--max_steps", "5", "--batch_size", "256", "--log_samples", str(N),
                            "--log_with", "tensorboard", "--project_dir", two)), check=True, timeout=600)
    check_samples(events(two), [5], "zero3 x2")

    p = h.run(program("--log_samples", "65", "--project_dir", os.path.join(tmp, "bad")))
    h.check_clean_failure(p, "--log_samples 65", expect="--log_samples")
print("OK")
