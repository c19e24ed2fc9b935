"""Elastic world size across machines (`hasten launch --num_machines MIN:MAX`, machine_agents.hpp).

Three loopback machines of one process each train hasten-example (mlp-small, ddp, gloo, gradient
accumulation 2) with a checkpoint every 5 steps, --resume, and the csv tracker logging every step's
loss (one metrics-N.csv per round, exact doubles):
- machine 2's launcher and its worker are killed for good: the run restarts from the newest
  checkpoint on 2 machines (world 2);
- a new launcher for machine 2 joins: the run restarts on 3 machines and finishes.
Each round's losses equal, bit for bit, those of a run started at that world size (`hasten launch
--num_processes N`, gloo) from a copy of the checkpoint the round resumed from (the loader's
position and the optimizer resharded by load_state), and the final parameters are that run's.
Prints the time from the kill to the first step on 2 machines and from the join to the first step
on 3. A machine stopped (SIGSTOP: its connection stays open, as with a machine that lost power)
is counted gone once it has said nothing for 10 s, and the run finishes on the other two.
Refused in one line each: --num_machines 3:2, and an elastic range without max_restarts."""
import csv
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import harness as h

STEPS = 60
ENV = dict(os.environ, HASTEN_COMM="gloo", HASTEN_TEST_STEP_DELAY_MS="120")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def program(project, extra=()):
    return [h.example()[0], "--workload", "mlp-small", "--warmup", "0", "--steps", str(STEPS), "--log-every", "1",
            "--trackers", "csv", "--checkpoint_every", "5", "--resume", "--gradient_accumulation_steps", "2", "--project_dir", project, "--quiet", *extra]


class Machine:
    """One `hasten launch` agent in its own session (so that it and its worker die together), its
    output collected line by line with the time each line arrived."""

    def __init__(self, rank, port, project, extra):
        cmd = h.hasten("launch", "--num_machines", "2:3", "--machine_rank", str(rank), "--num_processes", "3",
                       "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--max_restarts", "4",
                       "--strategy", "ddp", *program(project, extra))
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                                  start_new_session=True)
        self.lines = []  # (time, line)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def workers(self):
        """The launcher's workers (each leads a process group of its own)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == self.p.pid:
                            found.append(int(entry))
                except (OSError, ValueError, IndexError):
                    pass
        return found

    def signal_all(self, sig):
        """The launcher and its workers' groups: the whole machine, as far as this run goes."""
        for pid in self.workers():
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        os.killpg(self.p.pid, sig)

    def kill_for_good(self):
        os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()

    def wait(self, timeout):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            h.fail(f"a launcher did not finish within {timeout} s:\n" + self.text())
        self.reader.join(timeout=10)
        return self.p.returncode

    def text(self):
        return "\n".join(line for _, line in self.lines)


def wait_for(what, predicate, timeout, machines):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    for m in machines:
        if m.p.poll() is None:
            os.killpg(m.p.pid, signal.SIGKILL)
    h.fail(f"timed out waiting for {what}:\n" + "\n---\n".join(m.text() for m in machines))


def checkpoints(project):
    return sorted(int(m.group(1)) for d in glob.glob(os.path.join(project, "checkpoints", "checkpoint_*"))
                  if (m := re.search(r"checkpoint_(\d+)$", d)) and os.path.exists(os.path.join(d, "manifest.json")))


def metrics_files(project):
    """The csv tracker's files in run order: metrics.csv, metrics-1.csv, ..."""
    found = glob.glob(os.path.join(project, "**", "metrics*.csv"), recursive=True)
    order = lambda p: 0 if os.path.basename(p) == "metrics.csv" else int(re.search(r"metrics-(\d+)", p).group(1))
    return sorted(found, key=order)


def losses(path):
    with open(path) as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r.get("loss")}


def first_row_time(project, index):
    files = metrics_files(project)
    if len(files) > index and losses(files[index]):
        return time.monotonic()
    return None


def reference(d, tag, world, checkpoint, extra=()):
    """A run of `world` processes on one machine from a copy of `checkpoint`: its losses by step."""
    project = os.path.join(d, tag)
    os.makedirs(os.path.join(project, "checkpoints"))
    shutil.copytree(checkpoint, os.path.join(project, "checkpoints", os.path.basename(checkpoint)))
    cmd = h.hasten("launch", "--num_processes", str(world), "--main_process_port", "0", "--strategy", "ddp",
                   *program(project, extra))
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(ENV, HASTEN_TEST_STEP_DELAY_MS="0"), timeout=600)
    if p.returncode != 0:
        h.fail(f"{tag}: exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    files = metrics_files(project)
    if len(files) != 1:
        h.fail(f"{tag}: expected one metrics file, found {files}")
    return losses(files[0])


def same(what, got, want):
    steps = sorted(got)
    if not steps:
        h.fail(f"{what}: the round logged no step")
    missing = [s for s in steps if s not in want]
    if missing:
        h.fail(f"{what}: steps {missing} are not in the reference run")
    differ = [(s, got[s], want[s]) for s in steps if got[s] != want[s]]
    if differ:
        h.fail(f"{what}: losses differ from the run started at that size from the same checkpoint: {differ[:5]}")
    print(f"ok: {what}: steps {steps[0]}..{steps[-1]} bit for bit those of a run started at that size from the same "
          f"checkpoint")


def silence_time(log, t_stop, machine):
    """The time from the stop to machine 0's line that a machine went silent."""
    for t, line in machine.lines:
        if "went silent" in line:
            return f"{t - t_stop:.1f} s"
    return "?"


def main():
    d = tempfile.mkdtemp(prefix="hasten-elastic-")
    try:
        project = os.path.join(d, "run")
        final = os.path.join(d, "final")
        extra = ["--params-out", final + ".st"]
        port = free_port()
        machines = [Machine(r, port, project, extra) for r in range(3)]
        wait_for("two checkpoints of the 3-machine round", lambda: len(checkpoints(project)) >= 2, 300, machines)
        machines[2].kill_for_good()
        t_kill = time.monotonic()
        before = len(checkpoints(project))
        t_first_2 = wait_for("the first step of the 2-machine round", lambda: first_row_time(project, 1), 300,
                             machines[:2])
        wait_for("two checkpoints of the 2-machine round", lambda: len(checkpoints(project)) >= before + 2, 300,
                 machines[:2])
        machines.append(Machine(2, port, project, extra))
        t_join = time.monotonic()
        t_first_3 = wait_for("the first step of the grown round", lambda: first_row_time(project, 2), 300,
                             [machines[0], machines[1], machines[3]])
        for i in (0, 1, 3):
            rc = machines[i].wait(600)
            if rc != 0:
                h.fail(f"machine launcher {i} exited {rc}:\n" + machines[i].text())
        log = machines[0].text()
        for want in ("round 1 on 2 machines", "round 2 on 3 machines", "machine 2 left", "machine 2 joined"):
            if want not in log:
                h.fail(f"machine 0's output does not say '{want}':\n{log}")
        resumed = re.findall(r"resumed at step (\d+) from (\S+)", log)
        if len(resumed) != 2:
            h.fail(f"expected two resumes in machine 0's output, found {resumed}:\n{log}")
        files = metrics_files(project)
        if len(files) != 3:
            h.fail(f"expected three rounds' metrics files, found {files}")
        shrunk, grown = losses(files[1]), losses(files[2])
        same("after machine 2 left (world 3 -> 2)", shrunk, reference(d, "ref-2", 2, resumed[0][1]))
        grown_ref_extra = ["--params-out", os.path.join(d, "ref-3.st")]
        same("after machine 2 joined again (world 2 -> 3)", grown, reference(d, "ref-3", 3, resumed[1][1], grown_ref_extra))
        if max(grown) != STEPS:
            h.fail(f"the grown round ended at step {max(grown)}, not {STEPS}")
        with open(final + ".st", "rb") as a, open(os.path.join(d, "ref-3.st"), "rb") as b:
            if a.read() != b.read():
                h.fail("the elastic run's final parameters differ from the reference run's")
        print("ok: final parameters bit for bit those of the 3-process run from the same checkpoint")
        print(f"elastic: kill -> first step on 2 machines {t_first_2 - t_kill:.2f} s; "
              f"join -> first step on 3 machines {t_first_3 - t_join:.2f} s "
              f"(resumed at steps {resumed[0][0]} and {resumed[1][0]})")

        # A machine that goes silent (stopped: its connection stays open, as a machine that lost
        # power or its network): counted gone after 10 s without a word, the run goes on without it.
        project2 = os.path.join(d, "silent")
        port2 = free_port()
        quiet = [Machine(r, port2, project2, []) for r in range(3)]
        wait_for("a checkpoint of the silent run", lambda: len(checkpoints(project2)) >= 1, 300, quiet)
        quiet[2].signal_all(signal.SIGSTOP)
        t_stop = time.monotonic()
        try:
            for i in (0, 1):
                rc = quiet[i].wait(300)
                if rc != 0:
                    h.fail(f"silent run: machine launcher {i} exited {rc}:\n" + quiet[i].text())
        finally:
            quiet[2].signal_all(signal.SIGKILL)
            quiet[2].p.wait()
        log2 = quiet[0].text()
        for want in ("went silent", "round 1 on 2 machines"):
            if want not in log2:
                h.fail(f"silent run: machine 0's output does not say '{want}':\n{log2}")
        print(f"ok: a stopped machine counted gone after {silence_time(log2, t_stop, quiet[0])}; the run finished on 2 machines")

        # Bad ranges: one line each, nothing started.
        for args, expect in ((["--num_machines", "3:2"], "is not a count or a range MIN:MAX"),
                             (["--num_machines", "2:3"], "needs max_restarts above 0")):
            p = h.run(h.hasten("launch", *args, "--num_processes", "3", "--machine_rank", "0", "--main_process_port",
                               str(free_port()), h.example()[0]), timeout=60)
            h.check_clean_failure(p, " ".join(args), expect)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
