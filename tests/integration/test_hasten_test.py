"""hasten test:
- passes on 2 processes (ddp from the number of processes, and zero3), saying what it checked,
  with a loss that went down;
- a broken config (an unknown strategy, a misspelt key in the file, a bad value) fails before
  anything starts, with one line naming the problem;
- a run that trains but breaks a check (2 processes that do not synchronise gradients: the
  `single` strategy on each) fails naming the rank and the check, non-zero."""
import os
import re
import shutil
import tempfile

import harness as h


def passes(*args):
    p = h.run(h.hasten("test", *args), timeout=300)
    if p.returncode != 0:
        h.fail(f"hasten test {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    m = re.search(r"hasten test: ok, (\d+) processes, strategy (\S+), .* loss went from ([\d.e+-]+) to ([\d.e+-]+), "
                  r"ranks agree", p.stdout)
    if not m:
        h.fail(f"hasten test {' '.join(args)}: no success line:\n{p.stdout}\n{p.stderr}")
    first, last = float(m.group(3)), float(m.group(4))
    if not last < first:
        h.fail(f"success reported with a loss that did not go down: {p.stdout}")
    print("ok: " + p.stdout.strip())
    return m.group(2)


if passes("--num_processes", "2") != "ddp":
    h.fail("2 processes without a strategy should run ddp")
if passes("--num_processes", "2", "--strategy", "zero3", "--steps", "30") != "zero":
    h.fail("--strategy zero3 did not run the zero strategy")

with tempfile.TemporaryDirectory() as d:
    bad_key = os.path.join(d, "bad_key.yaml")
    with open(bad_key, "w") as f:
        f.write("num_processes: 2\nmixed_precison: bf16\n")
    for args, expect in (
        (["--num_processes", "2", "--strategy", "nosuch"], "nosuch"),
        (["--config_file", bad_key], "mixed_precison"),
        (["--num_processes", "2", "--mixed_precision", "fp8"], "fp8"),
        (["--num_processes", "0"], "num_processes"),
        (["--config_file", os.path.join(d, "missing.yaml")], "missing.yaml"),
    ):
        p = h.run(h.hasten("test", *args), timeout=120)
        h.check_clean_failure(p, "hasten test " + " ".join(args), expect)

# Gradients never synchronised: each rank trains on its own shard of the data, and the check
# that every rank's model agrees must catch it.
p = h.run(h.hasten("test", "--num_processes", "2", "--strategy", "single", "--steps", "20"), timeout=300)
h.check_clean_failure(p, "hasten test with unsynchronised ranks", "differs from rank 0")
if not re.search(r"test failed on rank [01] of 2: rank 1's model differs", p.stderr):
    h.fail("the failure does not name the rank and the check:\n" + p.stderr)
# The workers' output stays where the line says, for the user to read; this test removes it.
logs = re.search(r"every rank's output: (\S+)/rank_<r>\.log", p.stderr).group(1)
with open(os.path.join(logs, "rank_1.log")) as f:
    if "differs from rank 0" not in f.read():
        h.fail(f"{logs}/rank_1.log does not hold rank 1's error")
shutil.rmtree(logs)
print("hasten_test: OK")
