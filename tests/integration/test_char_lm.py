"""hasten-char-lm on Debian's fortunes corpus:
- a short run learns: its validation loss falls below the unigram entropy of the training text
  (the loss of the best model that ignores context), which the program computes and this test
  recomputes from the same files (char_lm_corpus.py);
- --init_from loads save_model's weights bitwise: a run that trains nothing (--epochs 0) from
  them reports the param_checksum of the run that saved them, which is also the SHA-256 this
  test computes over the saved model.safetensors; without --init_from the checksum differs;
  the same load under zero3 on 2 processes gives the same checksum;
- --resume from a mid-epoch checkpoint ends with the uninterrupted run's weights, bit for bit.
Skips (exit 77) when the fortunes package is not installed; scripts/install-deps.sh installs it."""
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile

import char_lm_corpus as corpus
import harness as h

if not corpus.corpus_files(corpus.FORTUNES):
    print(f"SKIP: the fortunes corpus is not installed in {corpus.FORTUNES} (apt-get install fortunes)")
    sys.exit(77)

EXE = os.path.join(h.BIN, "hasten-char-lm")
STEPS = 100
# Small enough for well under a minute on a busy 2-core machine, big enough to learn bigrams.
SMALL = ["--d_model", "64", "--n_layer", "2", "--n_head", "4", "--context", "32", "--batch_size", "8",
         "--val_windows", "128", "--lr", "3e-3", "--sample_chars", "80", "--quiet", "--json"]


def summary(p, what):
    if p.returncode != 0:
        h.fail(f"{what}: exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    for line in p.stdout.splitlines():
        line = line.removeprefix("[rank 0] ")  # hasten launch prefixes each rank's output
        if line.startswith("{"):
            return json.loads(line)
    h.fail(f"{what}: no JSON summary in the output:\n{p.stdout}\n{p.stderr}")


def safetensors_checksum(path):
    """hasten::param_checksum of a safetensors file: SHA-256 over the tensors' bytes in name order."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    sha = hashlib.sha256()
    for name in sorted(header):
        begin, end = header[name]["data_offsets"]
        sha.update(blob[8 + n + begin:8 + n + end])
    return sha.hexdigest()


with tempfile.TemporaryDirectory() as d:
    # (a) a short run learns more than byte frequencies.
    run = summary(h.run([EXE, *SMALL, "--max_steps", str(STEPS), "--project_dir", os.path.join(d, "a"),
                         "--save_model", os.path.join(d, "weights")], timeout=600), "short run")
    train_text, val_text = corpus.split(corpus.FORTUNES)
    expected = corpus.unigram_entropy(train_text)
    if run["train_bytes"] != len(train_text) or run["val_bytes"] != len(val_text):
        h.fail(f"training/validation bytes {run['train_bytes']}/{run['val_bytes']}, expected "
               f"{len(train_text)}/{len(val_text)}")
    if abs(run["unigram_entropy"] - expected) > 1e-9:
        h.fail(f"unigram entropy {run['unigram_entropy']}, recomputed {expected}")
    if run["steps"] != STEPS or run["val_windows"] != 128:
        h.fail(f"steps {run['steps']} (expected {STEPS}), validation windows {run['val_windows']} (expected 128)")
    if not run["val_loss"] < run["unigram_entropy"]:
        h.fail(f"validation loss {run['val_loss']} is not below the unigram entropy {run['unigram_entropy']}")
    if run["mixed_precision"] != "bf16" or len(run["sample"]) == 0:
        h.fail(f"expected a bf16 run with a sample: {run}")
    if not os.path.isdir(run["checkpoint"]):
        h.fail(f"the run's last checkpoint {run['checkpoint']} does not exist")
    print(f"ok: validation loss {run['val_loss']:.4f} < unigram entropy {expected:.4f} nats/char after {STEPS} steps")

    # (b) --init_from is a bitwise load.
    saved = safetensors_checksum(os.path.join(d, "weights", "model.safetensors"))
    if saved != run["param_checksum"]:
        h.fail(f"save_model wrote weights with checksum {saved}, the run reported {run['param_checksum']}")
    fresh = summary(h.run([EXE, *SMALL, "--epochs", "0", "--project_dir", os.path.join(d, "b")]), "fresh")
    loaded = summary(h.run([EXE, *SMALL, "--epochs", "0", "--init_from", os.path.join(d, "weights"),
                            "--project_dir", os.path.join(d, "c")]), "--init_from")
    if loaded["param_checksum"] != saved:
        h.fail(f"--init_from: checksum {loaded['param_checksum']}, saved weights {saved}")
    if fresh["param_checksum"] == saved:
        h.fail("a run without --init_from has the trained weights' checksum: the check cannot tell a load")
    if abs(loaded["val_loss"] - run["val_loss"]) > 1e-3:
        h.fail(f"--init_from: validation loss {loaded['val_loss']}, the saving run's {run['val_loss']}")
    print(f"ok: --init_from loads the saved weights bitwise ({saved[:16]}...)")
    sharded = summary(h.run(h.hasten("launch", "--num_processes", "2", "--strategy", "zero3", EXE, *SMALL, "--epochs",
                                     "0", "--init_from", os.path.join(d, "weights"), "--project_dir",
                                     os.path.join(d, "z"))), "--init_from under zero3")
    if sharded["param_checksum"] != saved or sharded["num_processes"] != 2:
        h.fail(f"--init_from under zero3 on 2 processes: checksum {sharded['param_checksum']}, saved {saved}")
    print("ok: the same load under zero3 on 2 processes")

    # (e) --num_workers 2: two worker threads read the batches ahead, in the epoch's order, so
    # the run is bitwise the one above (weights and validation loss).
    workers = summary(h.run([EXE, *SMALL, "--max_steps", str(STEPS), "--num_workers", "2", "--project_dir",
                             os.path.join(d, "w")], timeout=600), "--num_workers 2")
    if workers["param_checksum"] != run["param_checksum"] or workers["val_loss"] != run["val_loss"]:
        h.fail(f"--num_workers 2: checksum {workers['param_checksum']} val_loss {workers['val_loss']}, without "
               f"workers {run['param_checksum']} {run['val_loss']}")
    print(f"ok: --num_workers 2 trains bitwise like 0 (validation loss {workers['val_loss']:.6f})")

    # (d) --resume continues mid-epoch exactly: a run interrupted after its first checkpoint
    # (here: its last checkpoint removed) ends with the uninterrupted run's weights.
    project = os.path.join(d, "r")
    resume_args = [EXE, *SMALL, "--max_steps", "20", "--checkpoint_every", "10",
                   "--project_dir", project]
    whole = summary(h.run(resume_args), "uninterrupted run")
    if whole["checkpoint"] != os.path.join(project, "checkpoints", "checkpoint_1"):
        h.fail(f"20 steps with --checkpoint_every 10 ended in checkpoint {whole['checkpoint']}, expected checkpoint_1")
    shutil.rmtree(whole["checkpoint"])
    again = summary(h.run(resume_args + ["--resume"]), "resumed run")
    if again["resumed_from"] != os.path.join(project, "checkpoints", "checkpoint_0"):
        h.fail(f"--resume continued from '{again['resumed_from']}', expected checkpoint_0")
    if again["param_checksum"] != whole["param_checksum"] or again["steps"] != 20:
        h.fail(f"resumed run: {again['steps']} steps, checksum {again['param_checksum']}; uninterrupted: "
               f"{whole['param_checksum']}")
    print("ok: --resume after step 10 ends with the uninterrupted run's weights")
print("ok")
