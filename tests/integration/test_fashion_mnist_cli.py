"""hasten-fashion-mnist's command line: --help lists the flags; a missing data set, a bad flag
value and an unknown flag are one clear error line and a non-zero exit. Needs no data set."""
import os
import tempfile

import harness as h

EXE = os.path.join(h.BIN, "hasten-fashion-mnist")

p = h.run([EXE, "--help"])
if p.returncode != 0:
    h.fail(f"--help exited {p.returncode}: {p.stderr}")
for flag in ("--epochs", "--max_steps", "--batch_size", "--lr", "--data_dir", "--project_dir", "--resume", "--json",
             "--quiet"):
    if flag not in p.stdout:
        h.fail(f"--help does not mention {flag}:\n{p.stdout}")
print("ok: --help")

with tempfile.TemporaryDirectory() as empty:
    p = h.run([EXE, "--data_dir", empty, "--project_dir", os.path.join(empty, "run")])
    h.check_clean_failure(p, "missing data set", expect="apt-get install dataset-fashion-mnist")
    if empty not in p.stderr:
        h.fail(f"the missing-data message does not name the directory {empty}: {p.stderr}")
    if os.path.exists(os.path.join(empty, "run")):
        h.fail("a run without data created its project directory")
    # A file that is not IDX: named, not a crash.
    with open(os.path.join(empty, "train-images-idx3-ubyte"), "wb") as f:
        f.write(b"not an idx file")
    with open(os.path.join(empty, "train-labels-idx1-ubyte"), "wb") as f:
        f.write(b"\x00\x00\x08\x01\x00\x00\x00\x01\x03")
    p = h.run([EXE, "--data_dir", empty])
    h.check_clean_failure(p, "damaged data file", expect="train-images-idx3-ubyte")

h.check_clean_failure(h.run([EXE, "--epochs", "0"]), "--epochs 0", expect="--epochs: expects a whole number >= 1")
h.check_clean_failure(h.run([EXE, "--batch_size", "x"]), "--batch_size x", expect="--batch_size: expects a whole number >= 1")
h.check_clean_failure(h.run([EXE, "--lr", "-1"]), "--lr -1", expect="--lr: expects a number > 0")
h.check_clean_failure(h.run([EXE, "--no_such_flag"]), "unknown flag", expect="--no_such_flag")
print("ok")
