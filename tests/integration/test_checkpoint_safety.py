"""Nothing lost when a checkpoint is replaced: a process killed (SIGKILL) or failing at every
point of save_state into an existing directory leaves a checkpoint that loads, the previous one
or the new one, never neither; with an atomic swap (renameat2) and without it (the set-aside
path, forced by HASTEN_TEST_NO_RENAME_EXCHANGE). The injection points exist in test builds
only (core/src/util/test_hooks.hpp)."""
import os
import shutil
import signal
import tempfile

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-worker")
NO_HOOKS = {k: "" for k in ("HASTEN_TEST_CRASH_AT", "HASTEN_TEST_FAIL_AT", "HASTEN_TEST_NO_RENAME_EXCHANGE")}


def fingerprint(p):
    for line in p.stdout.splitlines():
        if line.startswith("params "):
            return line.split()[1]
    h.fail(f"no params line:\n{p.stdout}\n{p.stderr}")


def run(*args, env=None):
    return h.run([WORKER, *args], env={**NO_HOOKS, **(env or {})}, timeout=120)


def loaded(target):
    p = run("--steps", "0", "--load", target)
    if p.returncode != 0:
        h.fail(f"the checkpoint at {target} does not load:\n{p.stderr}")
    return fingerprint(p)


with tempfile.TemporaryDirectory() as d:
    target = os.path.join(d, "ckpt")
    first = run("--steps", "2", "--save", target)
    if first.returncode != 0:
        h.fail(f"the first save failed:\n{first.stderr}")
    old = loaded(target)
    new_run = run("--steps", "3", "--save", os.path.join(d, "reference"))
    new = fingerprint(new_run)
    if new == old:
        h.fail("the two runs' parameters are equal: the test could not tell the checkpoints apart")

    points = [("swap", p) for p in ("save-model-written", "save-files-written", "save-manifest-written", "save-swapped")]
    points += [("set-aside", p) for p in ("save-manifest-written", "save-set-aside", "save-swapped")]
    for path, point in points:
        for how in ("CRASH", "FAIL"):
            env = {f"HASTEN_TEST_{how}_AT": point}
            if path == "set-aside":
                env["HASTEN_TEST_NO_RENAME_EXCHANGE"] = "1"
            p = run("--steps", "3", "--save", target, env=env)
            if how == "CRASH" and p.returncode != -signal.SIGKILL:
                h.fail(f"{point} ({path}): the save was not killed (exit {p.returncode}):\n{p.stderr}")
            if how == "FAIL" and (p.returncode != 1 or f"injected failure at {point}" not in p.stderr):
                h.fail(f"{point} ({path}): the injected failure did not end the program with one line:\n{p.stderr}")
            got = loaded(target)
            want = new if point == "save-swapped" else old
            if got != want:
                h.fail(f"{point} ({path}, {how.lower()}): the directory loads {got}, expected "
                       f"{'the new' if want == new else 'the previous'} checkpoint {want}")
            left = sorted(os.listdir(d))
            # The next save cleans up after the interrupted one and replaces the checkpoint.
            again = run("--steps", "2", "--save", target)
            if again.returncode != 0:
                h.fail(f"after {point} ({path}, {how.lower()}), saving again failed:\n{again.stderr}")
            if loaded(target) != old:
                h.fail(f"after {point} ({path}), saving again did not replace the checkpoint")
            if sorted(os.listdir(d)) != ["ckpt", "reference"]:
                h.fail(f"saving again left {sorted(os.listdir(d))}")
            print(f"ok: {how.lower()} at {point} ({path}): loads the {'new' if want == new else 'previous'} "
                  f"checkpoint; left {left}, cleaned by the next save")

    # A directory that is not a checkpoint, with a manifest.json of its own, is refused and untouched.
    site = os.path.join(d, "site")
    os.makedirs(os.path.join(site, "assets"))
    with open(os.path.join(site, "manifest.json"), "w") as f:
        f.write('{"name": "my app", "icons": []}')
    p = run("--steps", "1", "--save", site)
    h.check_clean_failure(p, "save_state into a web project", "is not a hasten checkpoint")
    with open(os.path.join(site, "manifest.json")) as f:
        if f.read() != '{"name": "my app", "icons": []}' or sorted(os.listdir(site)) != ["assets", "manifest.json"]:
            h.fail("save_state changed a directory it refused")
    if sorted(os.listdir(d)) != ["ckpt", "reference", "site"]:
        h.fail(f"a refused save left {sorted(os.listdir(d))}")
    print("ok: a directory with an unrelated manifest.json is refused and left as it was")
print("checkpoint safety: OK")
