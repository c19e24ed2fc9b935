"""Progress of hasten-example and hasten-bench (hasten::ProgressBar on stderr):
- not a terminal: plain lines (no carriage return), step of total, loss, samples/s, elapsed and
  remaining time, the last at 100%; stdout keeps only the summary (one JSON line with --json);
- on a terminal (a pseudo-terminal here): one line redrawn in place with carriage returns;
- launched on 2 processes: only the local main process draws;
- --quiet: nothing on stderr."""
import json
import os
import pty
import re
import subprocess

import harness as h

LINE = re.compile(r"^mlp-small(?: \S+)?  (\d+)/(\d+) \((\d+)%\)  loss [\d.e+-]+  \d+ samples/s  elapsed \d\d:\d\d"
                  r"(?:  remaining \d\d:\d\d)?$")


def check_plain(stderr, total, what, prefix=""):
    if "\r" in stderr:
        h.fail(f"{what}: carriage returns in non-terminal progress:\n{stderr!r}")
    lines = [l for l in stderr.splitlines() if l.strip()]
    if len(lines) < 2:
        h.fail(f"{what}: expected several progress lines, got:\n{stderr}")
    steps = []
    for l in lines:
        if not l.startswith(prefix) or not LINE.match(l[len(prefix):]):
            h.fail(f"{what}: not a progress line: {l!r}")
        steps.append(int(LINE.match(l[len(prefix):]).group(1)))
    if steps != sorted(steps) or steps[-1] != total or f"{total}/{total} (100%)" not in lines[-1]:
        h.fail(f"{what}: progress does not end at {total}/{total}:\n{stderr}")
    print(f"ok: {what}: {len(lines)} plain lines, last: {lines[-1]}")


base = ["--workload", "mlp-small", "--warmup", "0", "--steps", "40"]
p = h.run(h.example(*base, "--json"), check=True)
check_plain(p.stderr, 40, "hasten-example --json")
if len(p.stdout.splitlines()) != 1 or json.loads(p.stdout)["workload"] != "mlp-small":
    h.fail("stdout is not one JSON line:\n" + p.stdout)

p = h.run(h.example(*base, "--impl", "libtorch"), check=True)
check_plain(p.stderr, 40, "hasten-example --impl libtorch")
if not p.stdout.startswith("done: mlp-small"):
    h.fail("stdout does not hold the summary:\n" + p.stdout)

p = h.run(h.example(*base, "--quiet"), check=True)
if p.stderr.strip():
    h.fail("--quiet still prints on stderr:\n" + p.stderr)
print("ok: hasten-example --quiet: stderr empty")

p = h.run(h.hasten("launch", "--num_processes", "2", h.example()[0], *base), check=True)
check_plain(p.stderr, 40, "hasten launch --num_processes 2 hasten-example", prefix="[rank 0] ")

p = h.run([os.path.join(h.BIN, "hasten-bench"), "--workload", "mlp-small", "--mode", "single", "--impl", "hasten",
           "--warmup", "0", "--steps", "20"], check=True)
check_plain(p.stderr, 20, "hasten-bench")
if json.loads(p.stdout.splitlines()[0])["mode"] != "single":
    h.fail("hasten-bench stdout is not its JSON line:\n" + p.stdout)
p = h.run([os.path.join(h.BIN, "hasten-bench"), "--workload", "mlp-small", "--mode", "single", "--impl", "hasten",
           "--warmup", "0", "--steps", "20", "--quiet"], check=True)
if p.stderr.strip():
    h.fail("hasten-bench --quiet still prints on stderr:\n" + p.stderr)
print("ok: hasten-bench --quiet: stderr empty")

# A terminal: stderr on a pseudo-terminal gets the bar redrawn in place.
master, slave = pty.openpty()
proc = subprocess.Popen(h.example(*base), stdout=subprocess.PIPE, stderr=slave, text=True)
os.close(slave)
chunks = []
while True:
    try:
        data = os.read(master, 65536)
    except OSError:  # EIO: the program closed the terminal
        break
    if not data:
        break
    chunks.append(data)
proc.wait(timeout=300)
os.close(master)
tty = b"".join(chunks).decode(errors="replace")
if proc.returncode != 0 or tty.count("\r") < 2 or "[########################] mlp-small  40/40 (100%)" not in tty:
    h.fail(f"terminal progress not redrawn in place (exit {proc.returncode}):\n{tty!r}")
print(f"ok: terminal: {tty.count(chr(13))} redraws, ends with the full bar")
print("progress_cli: OK")
