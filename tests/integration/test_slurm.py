"""A real one-node SLURM cluster on loopback (label `cluster`: `make test-cluster`; `make test`
leaves it out): Debian's slurm-wlm and munge (installed here when missing, as root), a munged,
slurmctld and slurmd with a slurm.conf generated in a temporary directory on free ports, all
stopped and removed at the end. Then:
- `srun -n 2 hasten-fashion-mnist` trains with nothing set (ranks from SLURM_PROCID..., the
  store's port from SLURM_JOB_ID) to the test loss of `hasten launch --num_processes 2`, bitwise;
- an sbatch script (docs/launch.md's, one node) does the same, read back from its output file;
- a task SIGKILLed at step 10 ends the step: srun names the task, and the surviving rank's
  error names the rank that died;
- scancel of a running job stops it: the ranks see acc.stop_requested() at one step, write a
  final checkpoint and return; the job ends CANCELLED and none of its processes is left.
Skips (exit 77) when the packages cannot be installed or Fashion-MNIST is missing."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
if not os.path.isfile(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print(f"SKIP: Fashion-MNIST is not installed in {DATA}")
    sys.exit(77)
if shutil.which("slurmctld", path="/usr/sbin:/usr/bin") is None or shutil.which("munged", path="/usr/sbin") is None:
    if os.geteuid() != 0:
        print("SKIP: slurm-wlm and munge are not installed and this is not root")
        sys.exit(77)
    p = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"],
                       capture_output=True, text=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if p.returncode != 0:
        print(f"SKIP: apt-get install slurm-wlm munge failed:\n{p.stderr[-2000:]}")
        sys.exit(77)

PROGRAM = os.path.join(h.BIN, "hasten-fashion-mnist")
ARGS = ["--epochs", "1", "--max_steps", "40", "--batch_size", "32", "--eval_batch_size", "500", "--threads", "1",
        "--json", "--quiet"]


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def summary_of(text, what):
    for line in text.splitlines():
        line = line.removeprefix("[rank 0] ")
        if line.startswith("{"):
            return json.loads(line)
    h.fail(f"{what}: no JSON summary:\n{text}")


def wait_until(what, check, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    h.fail(f"timed out waiting for {what}")


with tempfile.TemporaryDirectory() as d:
    munge_dir = os.path.join(d, "munge")
    os.makedirs(munge_dir, mode=0o700)
    key = os.path.join(munge_dir, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    socket_path = os.path.join(munge_dir, "munge.socket")
    node = socket.gethostname().split(".")[0]
    ctld_port, slurmd_port = free_ports(2)
    conf = os.path.join(d, "slurm.conf")
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(d, sub))
    with open(conf, "w") as f:
        f.write(f"""ClusterName=hastentest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig=/dev/null
KillWait=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
    env = dict(os.environ, SLURM_CONF=conf)
    for variable in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(variable, None)
    daemons = []

    def pid_of(name):
        try:
            with open(os.path.join(d, name)) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    try:
        subprocess.run(["/usr/sbin/munged", f"--key-file={key}", f"--socket={socket_path}",
                        f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
                        f"--seed-file={munge_dir}/seed", "--force"], check=True, capture_output=True)
        daemons.append("munge/munged.pid")
        subprocess.run(["/usr/sbin/slurmctld", "-f", conf], check=True, env=env, capture_output=True)
        daemons.append("slurmctld.pid")
        subprocess.run(["/usr/sbin/slurmd", "-f", conf], check=True, env=env, capture_output=True)
        daemons.append("slurmd.pid")

        def idle():
            p = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env)
            return p.returncode == 0 and p.stdout.strip() == "idle"
        wait_until("the node to be idle (sinfo)", idle)
        print(f"ok: a one-node SLURM cluster ({node}, slurmctld on port {ctld_port})")

        # The reference: hasten launch on the same machine.
        want = summary_of(h.run(h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", PROGRAM, *ARGS,
                                         "--project_dir", os.path.join(d, "launch")), check=True).stdout, "hasten launch")

        # srun -n 2, nothing set.
        p = h.run(["srun", "-n", "2", PROGRAM, *ARGS, "--project_dir", os.path.join(d, "srun")], env=env)
        if p.returncode != 0:
            h.fail(f"srun -n 2 exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        got = summary_of(p.stdout, "srun -n 2")
        if got["test_loss"] != want["test_loss"] or got["num_processes"] != 2 or got["eval_count"] != 10000:
            h.fail(f"srun -n 2: {got}, hasten launch: {want}")
        print(f"ok: srun -n 2: test_loss {got['test_loss']} as under hasten launch")

        # An sbatch script, as docs/launch.md writes it (one node here).
        out = os.path.join(d, "sbatch.out")
        script = os.path.join(d, "train.sbatch")
        with open(script, "w") as f:
            f.write(f"""#!/bin/bash
#SBATCH --job-name=fmnist
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --output={out}
srun {PROGRAM} {' '.join(ARGS)} --project_dir {d}/sbatch
""")
        p = h.run(["sbatch", "--parsable", script], env=env, check=True)
        job = p.stdout.strip().split(";")[0]

        def job_state(job_id):
            p = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env)
            for word in p.stdout.split():
                if word.startswith("JobState="):
                    return word.split("=", 1)[1]
            return ""
        state = wait_until(f"sbatch job {job} to end", lambda: job_state(job) in ("COMPLETED", "FAILED", "CANCELLED",
                                                                                  "TIMEOUT") and job_state(job), 300)
        text = open(out).read() if os.path.exists(out) else ""
        if state != "COMPLETED":
            h.fail(f"sbatch job {job} ended {state}:\n{text}")
        got = summary_of(text, "sbatch")
        if got["test_loss"] != want["test_loss"]:
            h.fail(f"sbatch: test_loss {got['test_loss']}, hasten launch: {want['test_loss']}")
        print(f"ok: sbatch job {job} COMPLETED: test_loss {got['test_loss']} as under hasten launch")

        # A task killed mid-run: the step ends, and both srun and the surviving rank name it.
        p = h.run(["srun", "-n", "2", os.path.join(h.BIN, "hasten-example"), "--workload", "mlp-small", "--steps", "40",
                   "--warmup", "0", "--log-every", "0", "--quiet"],
                  env=dict(env, HASTEN_TEST_KILL_AT_STEP="10", HASTEN_TEST_KILL_RANK="1"))
        if p.returncode == 0 or "task 1: Killed" not in p.stderr or "rank 1" not in p.stderr:
            h.fail(f"srun with task 1 killed: status {p.returncode}\n{p.stderr}")
        line = next(l for l in p.stderr.splitlines() if "rank 1" in l)
        print(f"ok: a killed task ends the step: {line.strip()}")

        # scancel of a running job: it ends CANCELLED, and none of its processes is left.
        long_args = ["--epochs", "50", "--batch_size", "32", "--threads", "1", "--quiet", "--json"]
        with open(script, "w") as f:
            f.write(f"""#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --output={out}
srun {PROGRAM} {' '.join(long_args)} --project_dir {d}/cancelled
""")
        job = h.run(["sbatch", "--parsable", script], env=env, check=True).stdout.strip().split(";")[0]
        wait_until(f"job {job} to run", lambda: job_state(job) == "RUNNING", 120)

        def training_processes():
            p = subprocess.run(["pgrep", "-f", f"{d}/cancelled"], capture_output=True, text=True)
            return [int(x) for x in p.stdout.split()]
        wait_until("its two training processes", lambda: len(training_processes()) >= 2, 120)
        time.sleep(6)  # past the set-up (reading the data): the loop asks stop_requested() from its first step
        h.run(["scancel", job], env=env, check=True)
        state = wait_until(f"job {job} to end after scancel", lambda: job_state(job) in ("CANCELLED", "COMPLETED",
                                                                                          "FAILED") and job_state(job), 120)
        if state != "CANCELLED":
            h.fail(f"job {job} after scancel: {state}")
        wait_until("the cancelled job's processes to be gone", lambda: not training_processes(), 60)
        # scancel's SIGTERM reached the ranks: acc.stop_requested() stopped them at one step,
        # and rank 0 wrote the final checkpoint before returning (within KillWait).
        text = open(out).read() if os.path.exists(out) else ""
        got = summary_of(text, "the cancelled job")
        if not got["stopped"] or not os.path.isfile(os.path.join(got["checkpoint"], "manifest.json")):
            h.fail(f"scancel: no final checkpoint: {got}")
        print(f"ok: scancel {job}: CANCELLED, a final checkpoint at step {got['steps']} ({got['checkpoint']}), "
              "no process left")
    finally:
        for name in reversed(daemons):
            pid = pid_of(name)
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for name in reversed(daemons):
            pid = pid_of(name)
            deadline = time.monotonic() + 20
            while pid and time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
print("slurm: OK")
