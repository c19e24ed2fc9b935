#!/usr/bin/env python3
"""hasten-fashion-mnist (apps/examples/fashion_mnist.cpp) written in plain PyTorch: the peer that
`make bench` (scripts/bench.py --fashion-mnist) times next to hasten on the real data set.

    .venv/bin/python scripts/fashion_mnist_torch.py --epochs 1 --num_processes 2 --json
    .venv/bin/python scripts/fashion_mnist_torch.py --max_steps 200 --print_order 2

Run it with the project's interpreter, .venv/bin/python (made by `make deps`): its torch is the
PyPI wheel whose LibTorch hasten builds against.
Nothing from hasten is imported; everything the C++ example does is done here the same way:

- data: the four gzip IDX files of Debian's dataset-fashion-mnist, scaled to [0, 1] and centred
  with the same mean and std (0.2860, 0.3530), in float32;
- model: the same CNN (conv 5x5 16, pool, conv 5x5 32, pool, 128, 10) built in the same order
  after torch.manual_seed(seed), so PyTorch's default init draws the same numbers as LibTorch's;
- order: epoch e shuffles with torch.randperm(60000) from a CPU generator seeded with seed + e,
  rank r takes batch b at positions (b * world + r) * batch ... + batch of that order, and the
  last round is completed by wrapping to the start of the order (hasten's even_batches);
- optimizer: Adam(lr), the lr decaying along a half cosine to 0 at the last step (hasten's
  cosine_with_warmup with no warmup), one intra-op thread per process (--threads): LibTorch's
  pool and, in the wheel, MKL's (its CPU BLAS), both sized by set_num_threads;
- two or more processes: DistributedDataParallel with its defaults on a Gloo process group
  (env://), the copies started by this script (or by torchrun: RANK and WORLD_SIZE set);
- evaluation: the 10,000 test images sharded the same way (batches of --eval_batch_size), each
  counted once (padding left out), summed over ranks.

samples/s counts the global batch of every step over the seconds of the training loops only
(evaluation left out), as hasten-fashion-mnist reports it. Rank 0 prints, with --json, one line
with the keys of hasten-fashion-mnist --json (test_accuracy, test_loss, eval_count, epochs,
steps, seconds, train_seconds, samples_per_s, num_processes, strategy) plus impl, torch,
threads. --print_order N prints, per rank, the sample indices of the first N batches of epoch 0
as JSON lines ({"rank": r, "batch": b, "indices": [...]}) and exits without training.
"""
import argparse
import ctypes
import datetime
import gzip
import json
import math
import os
import socket
import struct
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # fashion_mnist_data.cpp's kMean, kStd
STUCK_RANK_GRACE_S = 20


def set_blas_threads(n):
    """The BLAS pool's size decides how products are split, as hasten-fashion-mnist --threads
    sizes it. In the wheel torch.set_num_threads(n) does it (MKL's pool with OpenMP's) and there
    is nothing to do here; only where an OpenBLAS is loaded (a torch built on Debian's pthread
    OpenBLAS, whose pool set_num_threads does not reach) is that pool sized by its own call.
    numpy's bundled libscipy_openblas64_ is not torch's BLAS and is left alone."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[5] for line in f if len(line.split()) >= 6
                            and os.path.basename(line.split()[5]).startswith("libopenblas")})
    except OSError:
        return
    for path in paths:
        try:
            ctypes.CDLL(path).openblas_set_num_threads(n)
            return
        except (OSError, AttributeError):
            continue


def die(msg, code=2):
    print(f"fashion_mnist_torch: error: {msg}", file=sys.stderr)
    sys.exit(code)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the problem, not the usage block
        die(f"{message} (see --help)")


def parse_args(argv=None):
    p = OneLineParser(description="Train hasten-fashion-mnist's CNN on Fashion-MNIST in plain PyTorch.")
    p.add_argument("--epochs", type=int, default=2, help="passes over the 60,000 training images")
    p.add_argument("--max_steps", "--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--batch_size", "--batch-size", type=int, default=64, help="per-process batch size")
    p.add_argument("--eval_batch_size", "--eval-batch-size", type=int, default=256, help="per-process evaluation batch size")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the shuffle order")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--num_processes", "--num-processes", type=int, default=1, help="processes (DDP on Gloo when > 1)")
    p.add_argument("--data_dir", "--data-dir", default=DEFAULT_DATA_DIR, help="directory of the four IDX files (.gz or not)")
    p.add_argument("--json", action="store_true", help="print only a JSON summary line (rank 0)")
    p.add_argument("--print_order", "--print-order", type=int, default=0, metavar="N",
                   help="print the sample indices of each rank's first N batches of epoch 0 and exit")
    a = p.parse_args(argv)
    for name, low in (("epochs", 1), ("max_steps", 0), ("batch_size", 1), ("eval_batch_size", 1), ("threads", 1),
                      ("num_processes", 1), ("seed", 0), ("print_order", 0)):
        if getattr(a, name) < low:
            p.error(f"--{name} expects a whole number >= {low}, got {getattr(a, name)}")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        p.error(f"--lr expects a number > 0, got {a.lr}")
    return a


# --- data -------------------------------------------------------------------------------------

def find_file(data_dir, name):
    for candidate in (name + ".gz", name):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    die(f"Fashion-MNIST not found: no {name}.gz (or {name}) in '{data_dir}'; install it with "
        "`sudo apt-get install dataset-fashion-mnist`, or point --data_dir at a directory holding the four IDX files", 3)


def read_idx(path, dims):
    """IDX: magic 0x0000 08 <dims> (unsigned bytes), big-endian 32-bit dimensions, the bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        b = f.read()
    header = 4 + 4 * dims
    if len(b) < header or struct.unpack(">I", b[:4])[0] != (0x0800 | dims):
        die(f"'{path}' is not an IDX file of unsigned bytes with {dims} dimension(s)", 1)
    shape = struct.unpack(f">{dims}I", b[4:header])
    if len(b) - header != math.prod(shape):
        die(f"'{path}' holds {len(b) - header} data bytes, its header says {math.prod(shape)} (truncated?)", 1)
    return torch.frombuffer(bytearray(b[header:]), dtype=torch.uint8).reshape(shape)


def read_split(data_dir, prefix):
    images = read_idx(find_file(data_dir, prefix + "-images-idx3-ubyte"), 3)
    labels = read_idx(find_file(data_dir, prefix + "-labels-idx1-ubyte"), 1)
    if images.shape[1:] != (28, 28) or images.shape[0] != labels.shape[0]:
        die(f"{prefix}: {tuple(images.shape)} images and {labels.shape[0]} labels are not Fashion-MNIST's", 1)
    # The same float32 operations, in the same order, as fashion_mnist_data.cpp.
    x = images.to(torch.float32).div_(255.0).sub_(MEAN).div_(STD).unsqueeze(1)
    return x, labels.to(torch.long)


# --- hasten's DataLoader, replicated ----------------------------------------------------------

class Shard:
    """Rank `rank`'s batches of one epoch (core/src/data/data_loader.cpp: make_epoch_plan and
    EpochPlan::batch with drop_last false, even_batches true, split_batches false)."""

    def __init__(self, n, batch, world, rank, shuffle, seed, epoch):
        self.n, self.batch, self.world, self.rank = n, batch, world, rank
        if shuffle:
            g = torch.Generator()
            g.manual_seed(seed + epoch)
            self.order = torch.randperm(n, generator=g, dtype=torch.long)
        else:
            self.order = torch.arange(n, dtype=torch.long)
        if world == 1:
            self.num_batches, self.pad = (n + batch - 1) // batch, False  # a short last batch
        else:
            self.num_batches, self.pad = (n + batch * world - 1) // (batch * world), True

    def positions(self, b):
        start = (b * self.world + self.rank) * self.batch
        stop = start + self.batch if self.pad else min(start + self.batch, self.n)
        return torch.arange(start, stop)

    def indices(self, b):
        """(sample indices, how many of them are padding: positions past the end, wrapped)."""
        pos = self.positions(b)
        return self.order[pos % self.n], int((pos >= self.n).sum())


def batches_per_epoch(n, batch, world):
    return (n + batch * world - 1) // (batch * world)


# --- model ------------------------------------------------------------------------------------

class Cnn(torch.nn.Module):
    """fashion_mnist.cpp's CnnImpl: the same modules, created in the same order."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


# --- processes --------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world):
    """Runs `world` copies of this command line as ranks 0..world-1 (torchrun's environment);
    a failing rank ends the others; a rank still running well after rank 0 finished (Gloo
    teardown has hung on torch 1.13) is killed and the run counts as done."""
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(world)]
    rank0_done_at = None
    while True:
        codes = [p.poll() for p in procs]
        if None not in codes:
            return max(abs(c) for c in codes)
        if any(c not in (None, 0) for c in codes):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            return max(abs(p.wait()) for p in procs) or 1
        if codes[0] == 0:
            rank0_done_at = rank0_done_at or time.monotonic()
            if time.monotonic() - rank0_done_at > STUCK_RANK_GRACE_S:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                return 0
        time.sleep(0.05)


# --- the run ----------------------------------------------------------------------------------

def evaluate(model, x, y, batch, world, rank):
    """(accuracy, mean loss, count) over the test set, each image counted once."""
    model.eval()
    shard = Shard(x.shape[0], batch, world, rank, shuffle=False, seed=0, epoch=0)
    correct = count = 0
    loss_sum = 0.0
    with torch.no_grad():
        for b in range(shard.num_batches):
            idx, padding = shard.indices(b)
            real = idx.shape[0] - padding  # padding comes last in a batch
            logits = model(x.index_select(0, idx))[:real]
            target = y.index_select(0, idx)[:real]
            correct += int(logits.argmax(1).eq(target).sum())
            count += real
            loss_sum += float(F.cross_entropy(logits, target, reduction="none").sum())
    model.train()
    if world > 1:
        t = torch.tensor([correct, count, loss_sum], dtype=torch.float64)
        dist.all_reduce(t)
        correct, count, loss_sum = int(t[0]), int(t[1]), float(t[2])
    return (correct / count if count else 0.0), (loss_sum / count if count else 0.0), count


def main():
    a = parse_args()
    world = a.num_processes
    if world > 1 and not ("RANK" in os.environ and os.environ.get("WORLD_SIZE") == str(world)):
        sys.exit(run_ranks(world))
    rank = int(os.environ["RANK"]) if world > 1 else 0
    t0 = time.monotonic()

    if a.print_order:
        shard = Shard(60000, a.batch_size, world, rank, shuffle=True, seed=a.seed, epoch=0)
        for b in range(min(a.print_order, shard.num_batches)):
            print(json.dumps({"rank": rank, "batch": b, "indices": shard.indices(b)[0].tolist()}), flush=True)
        return

    # Before the process group, as the C++ example loads before its Accelerator: a missing data
    # set is reported at once.
    train_x, train_y = read_split(a.data_dir, "train")
    test_x, test_y = read_split(a.data_dir, "t10k")
    torch.set_num_threads(a.threads)
    set_blas_threads(a.threads)
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(minutes=10))
    torch.manual_seed(a.seed)
    model = Cnn()
    adam = torch.optim.Adam(model.parameters(), lr=a.lr)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    total_steps = a.epochs * batches_per_epoch(train_x.shape[0], a.batch_size, world)
    if a.max_steps > 0:
        total_steps = min(total_steps, a.max_steps)
    # hasten's cosine_with_warmup(warmup 0, total): 0.5 (1 + cos(pi * step / total)), floored at 0.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        adam, lambda s: max(0.0, 0.5 * (1.0 + math.cos(math.pi * s / max(1, total_steps)))))

    step = epoch = 0
    train_s = 0.0
    last = (0.0, 0.0, 0)
    while epoch < a.epochs and not (a.max_steps and step >= a.max_steps):
        shard = Shard(train_x.shape[0], a.batch_size, world, rank, shuffle=True, seed=a.seed, epoch=epoch)
        t_epoch = time.perf_counter()
        for b in range(shard.num_batches):
            idx, _ = shard.indices(b)  # padding samples are trained on, as hasten's are
            loss = F.cross_entropy(model(train_x.index_select(0, idx)), train_y.index_select(0, idx))
            loss.backward()
            adam.step()
            schedule.step()
            adam.zero_grad(set_to_none=False)  # zeroed in place; torch >= 2.0 defaults to None
            step += 1
            if a.max_steps and step >= a.max_steps:
                break
        train_s += time.perf_counter() - t_epoch
        last = evaluate(model, test_x, test_y, a.eval_batch_size, world, rank)
        epoch += 1
        if not a.json and rank == 0:
            print(f"epoch {epoch}/{a.epochs}: test accuracy {last[0]:.4f} ({round(last[0] * last[2])}/{last[2]}), "
                  f"test loss {last[1]:.4f}, step {step}", flush=True)
    seconds = time.monotonic() - t0
    samples_per_s = step * a.batch_size * world / train_s if train_s > 0 else 0.0
    if rank == 0:
        if a.json:
            print(json.dumps({"test_accuracy": last[0], "test_loss": last[1], "eval_count": last[2], "epochs": epoch,
                              "steps": step, "seconds": seconds, "train_seconds": train_s,
                              "samples_per_s": samples_per_s, "num_processes": world,
                              "strategy": "torch-ddp" if world > 1 else "single", "impl": "torch",
                              "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
        else:
            print(f"done: test accuracy {last[0]:.4f} on {last[2]} images after {epoch} epoch(s), {step} steps, "
                  f"{round(samples_per_s)} samples/s, {seconds:.1f} s", flush=True)
    if world > 1:
        dist.barrier()
        # Leave without tearing the process group down (it has hung a rank on torch 1.13).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
