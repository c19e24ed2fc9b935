"""DDP over 2 processes (hasten launch, and the same binary under torchrun and SLURM-style
environments) matches one process on the global batch and PyTorch's own DDP, within 1e-5."""
import os
import socket
import subprocess
import tempfile

import harness as h

STEPS = ["--workload", "mlp-small", "--warmup", "0", "--steps", "20", "--log-every", "0"]
EXAMPLE = os.path.join(h.BIN, "hasten-example")


def check(name, a, b, tol):
    d = h.max_abs_diff(a, b)
    print(f"{name}: max |diff| = {d:.3g}")
    if d > tol:
        h.fail(f"{name}: losses differ by {d} (tolerance {tol})")


with tempfile.TemporaryDirectory() as tmp:
    env = {"HASTEN_HOME": os.path.join(tmp, "home")}
    for accum in (1, 4):
        extra = ["--gradient_accumulation_steps", str(accum)] if accum > 1 else []
        mode = "ddp2" + ("-accum4" if accum > 1 else "")
        ddp = h.losses(h.hasten("launch", "--num_processes", "2", *extra, EXAMPLE, *STEPS), env=env)
        global_batch = h.losses(h.example(*STEPS, "--batch", "64", *extra), env=env)
        torch_ddp = h.losses(h.peer(*STEPS[:6], "--mode", mode), env=env)
        if len(ddp) != 20:
            h.fail(f"{mode}: expected 20 losses, got {len(ddp)}")
        if accum == 1:
            check(f"{mode} vs one process on the global batch", ddp, global_batch, 1e-5)
        else:
            # Two ranks average per-rank means; one process takes the mean of the global batch:
            # the same math, rounded differently. Over several Adam steps on accumulated
            # gradients that difference grows to ~5e-5 by micro-batch 20, and PyTorch shows
            # exactly the same drift (its single-process accumulation against its own DDP), so the
            # first two windows are held to 1e-5 and the rest to 1e-4; PyTorch DDP below is
            # matched to 1e-5 over all 20.
            check(f"{mode} vs one process on the global batch (2 windows)", ddp[:8], global_batch[:8], 1e-5)
            check(f"{mode} vs one process on the global batch (20 micro-batches)", ddp, global_batch, 1e-4)
        check(f"{mode} vs PyTorch DDP", ddp, torch_ddp, 1e-5)
        if accum == 1:
            reference = ddp

    # The same program under torchrun (flags that dodge Debian's Python 3.11 redirects bug).
    out = os.path.join(tmp, "torchrun.json")
    with socket.socket() as s:  # not torchrun's default 29500: other tests may hold it
        s.bind(("127.0.0.1", 0))
        torchrun_port = s.getsockname()[1]
    p = h.run([h.PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--no_python",
               "--master_port", str(torchrun_port),
               "--redirects", "1:2", "--tee", "1:2", "--log_dir", os.path.join(tmp, "tr"), EXAMPLE, *STEPS,
               "--losses-out", out], env=env, timeout=300)
    if p.returncode != 0:
        h.fail(f"torchrun run failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    import json
    with open(out) as f:
        check("torchrun vs hasten launch", json.load(f)["losses"], reference, 1e-6)

    # A SLURM-style environment (srun sets these; no RANK/WORLD_SIZE).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tmp, "slurm.json")
    procs = []
    for r in range(2):
        e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        e.update(env)
        e.update({"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r), "SLURM_NNODES": "1",
                  "SLURM_NODEID": "0", "SLURM_STEP_ID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([EXAMPLE, *STEPS, "--losses-out", out], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        o, e = p.communicate(timeout=300)
        if p.returncode != 0:
            h.fail(f"SLURM-style rank failed ({p.returncode}):\n{o}\n{e}")
    with open(out) as f:
        check("SLURM-style vs hasten launch", json.load(f)["losses"], reference, 1e-6)
print("ddp parity: OK")
