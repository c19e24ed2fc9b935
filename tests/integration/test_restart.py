"""Checkpoints end to end through hasten-example and hasten launch:
- automatic restart: a worker SIGKILLed after step 25 of 60, `--max_restarts 1`, a checkpoint
  every 10 steps, `--resume`: the run ends with status 0 and the uninterrupted run's
  param_checksum (SHA-256 of the final parameters, checked here against Python's hashlib);
- a worker SIGKILLed in the middle of a save leaves the previous checkpoint complete, and a
  resumed run continues from it to the same parameters;
- save_on_each_node: two machines with project directories of their own each keep a whole copy
  and resume from it after a kill; copies swapped between machines are refused in one line; on
  a shared directory one checkpoint holds every rank's files;
- restarts across machines: two launchers (`--num_machines 2`, machine ranks 0 and 1, on this
  host) with `--max_restarts 1`; a worker of machine 1 SIGKILLed: both machines restart their
  workers and end with the uninterrupted run's param_checksum; a launcher SIGKILLed ends the
  other machine's run with one line naming it, not a hang;
- the test's Python (.venv) reads the checkpoint's model.safetensors (the format's own rules, no
  library) and gets the parameters whose SHA-256 is the run's param_checksum; so does the
  file `hasten merge-weights` writes from the checkpoint."""
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import time
import tempfile

import harness as h

BASE = ["--workload", "mlp-small", "--steps", "60", "--warmup", "0", "--log-every", "0", "--json"]


def launch(*args, env=None, check=True):
    cmd = h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", *args)
    return h.run(cmd, env=env, check=check)


def summary(p):
    for line in p.stdout.splitlines():
        line = line.removeprefix("[rank 0] ")  # hasten launch prefixes each rank's output
        if line.startswith("{"):
            return json.loads(line)
    h.fail(f"no JSON summary in the output:\n{p.stdout}\n{p.stderr}")


def read_safetensors(path):
    """name -> raw bytes, straight from the format: u64 header size, JSON header, data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    if header.get("__metadata__", {}).get("format") != "pt":
        h.fail(f"{path}: __metadata__ lacks format: pt: {header.get('__metadata__')}")
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = blob[8 + n + begin:8 + n + end]
    return out


whole = summary(launch(h.example()[0], *BASE))
want = whole["param_checksum"]
if len(want) != 64:
    h.fail(f"param_checksum is not a SHA-256: {want!r}")

with tempfile.TemporaryDirectory() as d:
    # 1. Automatic restart after a worker is killed.
    project = os.path.join(d, "restart")
    p = launch("--max_restarts", "1", h.example()[0], *BASE, "--project_dir", project, "--checkpoint_every", "10",
               "--resume", env={"HASTEN_TEST_KILL_AT_STEP": "25"})
    s = summary(p)
    if "rank 1" not in p.stderr or "restart 1 of 1" not in p.stderr:
        h.fail(f"the launcher did not report the failure and the restart:\n{p.stderr}")
    if s["resumed_at"] != 20 or s["param_checksum"] != want:
        h.fail(f"restarted run: resumed at {s['resumed_at']} (want 20), checksum {s['param_checksum']} (want {want})")
    print(f"ok: killed at step 25, restarted from step 20, param_checksum equal ({want[:16]}...)")

    # The checkpoint's weights, read by Python, hash to the run's checksum at that step.
    ckpt = os.path.join(project, "checkpoints", "checkpoint_5")
    tensors = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    digest = hashlib.sha256(b"".join(tensors[k] for k in sorted(tensors))).hexdigest()
    if digest != want:
        h.fail(f"hashlib over checkpoint_5/model.safetensors is {digest}, the run's param_checksum is {want}")
    manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
    if not manifest.get("complete") or "model.safetensors" not in manifest["files"]:
        h.fail(f"manifest: {manifest}")
    # The manifest's checksums are standard CRC-32C (Castagnoli), checkable by other tools.
    def crc32c(data):
        crc = 0xFFFFFFFF
        for byte in data:
            crc ^= byte
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        return crc ^ 0xFFFFFFFF
    if crc32c(b"123456789") != 0xE3069283:
        h.fail("the test's own CRC-32C is wrong")
    state = open(os.path.join(ckpt, "hasten_state.json"), "rb").read()
    if f"{crc32c(state):08x}" != manifest["files"]["hasten_state.json"]["crc32c"]:
        h.fail(f"manifest CRC-32C of hasten_state.json is not the standard one: {manifest['files']['hasten_state.json']}")
    print("ok: Python reads model.safetensors; its SHA-256 is the run's param_checksum")
    # hasten merge-weights writes one file from a checkpoint; a missing path is one clear error.
    merged = os.path.join(d, "merged.safetensors")
    h.run(h.hasten("merge-weights", ckpt, merged), check=True)
    tensors = read_safetensors(merged)
    if hashlib.sha256(b"".join(tensors[k] for k in sorted(tensors))).hexdigest() != want:
        h.fail("hasten merge-weights of checkpoint_5 does not hold the checkpoint's parameters")
    h.check_clean_failure(h.run(h.hasten("merge-weights", os.path.join(d, "nowhere"), merged)),
                          "merge-weights of a missing directory", "does not exist")

    # 2. Killed while saving (rank 0, third save = step 30): the previous checkpoint survives.
    project = os.path.join(d, "crash")
    p = launch(h.example()[0], *BASE, "--project_dir", project, "--checkpoint_every", "10",
               env={"HASTEN_TEST_CRASH_AT": "save-model-written:3"}, check=False)
    if p.returncode == 0:
        h.fail("a run whose rank 0 was killed during a save exited 0")
    names = sorted(os.listdir(os.path.join(project, "checkpoints")))
    if [n for n in names if n.startswith("checkpoint_")] != ["checkpoint_0", "checkpoint_1"]:
        h.fail(f"after a crash in the third save the checkpoints are {names}")
    s = summary(launch(h.example()[0], *BASE, "--project_dir", project, "--checkpoint_every", "10", "--resume"))
    if s["resumed_at"] != 20 or s["param_checksum"] != want:
        h.fail(f"resumed after a crash in save: at {s['resumed_at']}, checksum {s['param_checksum']} (want {want})")
    print(f"ok: killed during a save; the previous checkpoint loaded ({names}), same final parameters")

    # 3. Restarts across machines: one launcher per "machine", both on this host.
    def two_free_ports():
        """A port P with P + 1 free too (the workers' store and the launchers' coordinator)."""
        for _ in range(50):
            with socket.socket() as a:
                a.bind(("", 0))
                port = a.getsockname()[1]
            if port >= 65535:
                continue
            try:
                with socket.socket() as b:
                    b.bind(("", port + 1))
                return port
            except OSError:
                continue
        h.fail("no two consecutive free ports")

    def machine(rank, port, project, env, extra=()):
        """One machine's launcher; `extra`: more arguments for the example."""
        cmd = h.hasten("launch", "--max_restarts", "1", "--num_machines", "2", "--machine_rank", str(rank),
                       "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
                       h.example()[0], *BASE, *extra, "--project_dir", project, "--checkpoint_every", "10", "--resume")
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **env})

    def both(m0, m1, what):
        """Both machines' (stdout, stderr) once they end; a failure of either names `what`."""
        out0, err0 = m0.communicate(timeout=300)
        out1, err1 = m1.communicate(timeout=300)
        if m0.returncode != 0 or m1.returncode != 0:
            h.fail(f"{what}: exited {m0.returncode} and {m1.returncode}\nmachine 0:\n{err0}\nmachine 1:\n{err1}")
        return out0, err0, out1, err1

    port = two_free_ports()
    project = os.path.join(d, "machines")
    kill = {"HASTEN_TEST_KILL_AT_STEP": "25"}
    out0, err0, out1, err1 = both(machine(0, port, project, kill), machine(1, port, project, kill),
                                  "two machines with --max_restarts 1")
    if "machine 1: rank 1" not in err0 or "stopping this machine's workers" not in err0:
        h.fail(f"machine 0's launcher did not say that machine 1's rank 1 failed:\n{err0}")
    for name, err in (("machine 0", err0), ("machine 1", err1)):
        if "restart 1 of 1" not in err:
            h.fail(f"{name}'s launcher did not restart its workers:\n{err}")
    s = summary(subprocess.CompletedProcess([], 0, out0, err0))
    if s["resumed_at"] != 20 or s["param_checksum"] != want:
        h.fail(f"two machines, restarted: resumed at {s['resumed_at']} (want 20), checksum {s['param_checksum']} "
               f"(want {want})")
    print("ok: a worker killed on machine 1: both machines restarted, same final parameters")

    # 4. save_on_each_node: machines without a shared file system (each machine's project_dir
    # here is a directory of its own). Each machine's first process writes a whole copy, every
    # process its own files beside it; after a worker of machine 1 is killed both machines
    # resume from their own copies. Under ddp (the optimizer state, unsharded, is rank 0's
    # file: machine 1's copy needs its own) and zero3 (one unit per Linear: the full weights
    # reach machine 1's writer from rank 0's gather).
    each = {**kill, "HASTEN_SAVE_ON_EACH_NODE": "true"}

    def machine_own(rank, port, project, env, strategy="zero3"):
        return machine(rank, port, project, env, ("--strategy", strategy, "--units"))

    for strategy in ("ddp", "zero3"):
        port = two_free_ports()
        own = [os.path.join(d, f"{strategy}-machine0"), os.path.join(d, f"{strategy}-machine1")]
        out0, err0, out1, err1 = both(machine_own(0, port, own[0], each, strategy),
                                      machine_own(1, port, own[1], each, strategy),
                                      f"save_on_each_node, two machines, {strategy}")
        # (Machine 1 has nothing else to load: its project directory holds only its own copies.)
        if f"resumed from {own[0]}" not in err0:
            h.fail(f"{strategy}: machine 0 did not resume from its own copy:\n{err0}")
        s = summary(subprocess.CompletedProcess([], 0, out0, err0))
        if s["resumed_at"] != 20 or s["param_checksum"] != want:
            h.fail(f"save_on_each_node, {strategy}, restarted: resumed at {s['resumed_at']} (want 20), checksum "
                   f"{s['param_checksum']} (want {want})")
        for which, ranks in ((0, [0]), (1, [1])):  # --num_processes counts every machine's
            ckpt = os.path.join(own[which], "checkpoints", "checkpoint_5")
            manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
            files = set(manifest["files"])
            if (manifest.get("ranks") != ranks or "model.safetensors" not in files or "hasten_state.json" not in files
                    or (strategy == "ddp" and "optimizer.rank0.safetensors" not in files)):
                h.fail(f"{strategy}: machine {which}'s copy: ranks {manifest.get('ranks')} (want {ranks}), "
                       f"files {sorted(files)}")
            rng = sorted(f for f in files if f.startswith("random_states_"))
            if rng != [f"random_states_{r}.safetensors" for r in ranks]:
                h.fail(f"machine {which}'s copy holds the random states {rng}, want its own ranks' {ranks}")
            tensors = read_safetensors(os.path.join(ckpt, "model.safetensors"))
            if hashlib.sha256(b"".join(tensors[k] for k in sorted(tensors))).hexdigest() != want:
                h.fail(f"{strategy}: machine {which}'s model.safetensors does not hold the run's final parameters")
        print(f"ok: save_on_each_node, {strategy}: each machine wrote a whole copy (its own ranks' files), both "
              "resumed from their own, same final parameters")

    # A machine's copy loads only where its ranks run: machine ranks swapped, each machine
    # finds the other's ranks in its copy and the run stops with one line (no restart budget).
    port = two_free_ports()
    m0 = machine_own(0, port, own[1], {"HASTEN_SAVE_ON_EACH_NODE": "true"})
    m1 = machine_own(1, port, own[0], {"HASTEN_SAVE_ON_EACH_NODE": "true"})
    out0, err0 = m0.communicate(timeout=300)
    out1, err1 = m1.communicate(timeout=300)
    if m0.returncode == 0 or m1.returncode == 0 or "one machine's copy of a checkpoint saved on each node" not in err0 + err1:
        h.fail(f"copies swapped between machines: exited {m0.returncode}\nmachine 0:\n{err0}\nmachine 1:\n{err1}")
    line = next(l for l in (err0 + err1).splitlines() if "one machine's copy" in l)
    print(f"ok: machine copies swapped: {line.strip()}")

    # One shared directory with save_on_each_node: machine 1 finds machine 0's temporary
    # directory of the same save and writes no copy of its own (one checkpoint, every rank's files).
    port = two_free_ports()
    shared = os.path.join(d, "shared")
    out0, err0, out1, err1 = both(machine_own(0, port, shared, each), machine_own(1, port, shared, each),
                                  "save_on_each_node on a shared directory")
    s = summary(subprocess.CompletedProcess([], 0, out0, err0))
    manifest = json.load(open(os.path.join(shared, "checkpoints", "checkpoint_5", "manifest.json")))
    if (s["param_checksum"] != want or s["resumed_at"] != 20 or "ranks" in manifest
            or "random_states_1.safetensors" not in manifest["files"]):
        h.fail(f"save_on_each_node on a shared directory: checksum {s['param_checksum']}, manifest {manifest}")
    print("ok: save_on_each_node on a shared file system: one checkpoint with every rank's files")

    # A launcher that dies ends the run on the other machine with one line, not a hang.
    port = two_free_ports()
    project = os.path.join(d, "machines-lost")
    m0, m1 = machine(0, port, project, {}), machine(1, port, project, {})
    deadline = time.monotonic() + 120
    while not os.path.isdir(os.path.join(project, "checkpoints")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the run is under way once the first checkpoint is written
    m1.send_signal(signal.SIGKILL)
    m1.communicate(timeout=60)
    out0, err0 = m0.communicate(timeout=120)
    if m0.returncode == 0 or "the launcher of machine 1 disconnected" not in err0:
        h.fail(f"machine 0 after machine 1's launcher was killed: status {m0.returncode}\n{err0}")
    print("ok: machine 1's launcher killed: machine 0 ends with 'the launcher of machine 1 disconnected'")

    # The coordinator's port is main_process_port + 1: the last port leaves none.
    h.check_clean_failure(
        h.run(h.hasten("launch", "--max_restarts", "1", "--num_machines", "2", "--machine_rank", "0",
                       "--num_processes", "2", "--main_process_port", "65535", h.example()[0], *BASE)),
        "main_process_port 65535 with restarts across machines", "main_process_port + 1")
