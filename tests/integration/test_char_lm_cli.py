"""hasten-char-lm's command line: --help lists the flags; a missing corpus, a bad flag value, an
unknown corpus file and unloadable --init_from weights are one clear error line and a non-zero
exit. Uses a two-file stand-in corpus, not the fortunes package."""
import os
import tempfile

import harness as h

EXE = os.path.join(h.BIN, "hasten-char-lm")

p = h.run([EXE, "--help"])
if p.returncode != 0:
    h.fail(f"--help exited {p.returncode}: {p.stderr}")
for flag in ("--epochs", "--max_steps", "--batch_size", "--gradient_accumulation_steps", "--lr", "--weight_decay",
             "--warmup_steps", "--data_dir", "--files", "--init_from", "--save_model", "--project_dir", "--resume",
             "--checkpoint_every", "--json", "--quiet", "--seed", "--log_with"):
    if flag not in p.stdout:
        h.fail(f"--help does not mention {flag}:\n{p.stdout}")
print("ok: --help")

with tempfile.TemporaryDirectory() as d:
    empty = os.path.join(d, "empty")
    os.mkdir(empty)
    p = h.run([EXE, "--data_dir", empty, "--project_dir", os.path.join(d, "run")])
    h.check_clean_failure(p, "missing corpus", expect="apt-get install fortunes")
    if empty not in p.stderr:
        h.fail(f"the missing-corpus message does not name the directory {empty}: {p.stderr}")
    if os.path.exists(os.path.join(d, "run")):
        h.fail("a run without a corpus created its project directory")
    # Index files alone are no corpus.
    with open(os.path.join(empty, "cookie.dat"), "wb") as f:
        f.write(b"\x00\x00\x00\x02")
    h.check_clean_failure(h.run([EXE, "--data_dir", empty]), "only .dat files", expect="apt-get install fortunes")

    corpus = os.path.join(d, "corpus")
    os.mkdir(corpus)
    for name in ("alpha", "beta"):
        with open(os.path.join(corpus, name), "w") as f:
            f.write("".join(f"{name} fortune number {i}, which is long enough to fill a window.\n%\n"
                            for i in range(40)))
    p = h.run([EXE, "--data_dir", corpus, "--files", "alpha,gamma"])
    h.check_clean_failure(p, "unknown corpus file", expect="'gamma'")
    if "alpha beta" not in p.stderr:
        h.fail(f"the unknown-file message does not list the available files: {p.stderr}")
    p = h.run([EXE, "--data_dir", corpus, "--init_from", os.path.join(d, "no-such-weights"), "--epochs", "0",
               "--project_dir", os.path.join(d, "r")])
    h.check_clean_failure(p, "missing --init_from weights", expect="no-such-weights")
    p = h.run([EXE, "--data_dir", corpus, "--context", "100000", "--project_dir", os.path.join(d, "r")])
    h.check_clean_failure(p, "context longer than the text", expect="--context 100000")

h.check_clean_failure(h.run([EXE, "--context", "0"]), "--context 0", expect="--context: expects a whole number >= 1")
h.check_clean_failure(h.run([EXE, "--val_fraction", "1.5"]), "--val_fraction 1.5",
                      expect="--val_fraction: expects a number in (0, 1)")
h.check_clean_failure(h.run([EXE, "--lr", "-1"]), "--lr -1", expect="--lr: expects a number > 0")
h.check_clean_failure(h.run([EXE, "--n_head", "3"]), "--n_head 3", expect="does not divide --d_model 128")
h.check_clean_failure(h.run([EXE, "--no_such_flag"]), "unknown flag", expect="--no_such_flag")
print("ok")
