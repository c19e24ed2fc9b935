"""hasten launch --gpu_ids, read from its dry run (no GPU needed): the workers see the listed
GPUs through CUDA_VISIBLE_DEVICES (counted among what the launcher sees) and get gpu_ids all;
more processes than listed GPUs, or GPUs hidden by an empty CUDA_VISIBLE_DEVICES, are refused
in one line before any worker starts."""
import os

import harness as h


def dry(*flags, env=None):
    return h.run(h.hasten("launch", "--dry-run", "--num_processes", "2", *flags, "true"), env=env)


def worker_env(p, rank):
    line = next(l for l in p.stdout.splitlines() if l.startswith(f"worker rank {rank} "))
    return dict(part.split("=", 1) for part in line.split(":", 1)[1].split() if "=" in part)


# The suite hides GPUs with an empty CUDA_VISIBLE_DEVICES; these runs start without it (h.run
# adds each call's own variables to this process's environment).
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
env = {}
p = dry("--gpu_ids", "2,0", env=env)
if p.returncode != 0:
    h.fail(f"--gpu_ids 2,0: {p.stderr}")
for rank in (0, 1):
    w = worker_env(p, rank)
    if w.get("CUDA_VISIBLE_DEVICES") != "2,0" or w.get("HASTEN_GPU_IDS") != "all":
        h.fail(f"worker {rank}: CUDA_VISIBLE_DEVICES={w.get('CUDA_VISIBLE_DEVICES')} HASTEN_GPU_IDS={w.get('HASTEN_GPU_IDS')}")
print("ok: --gpu_ids 2,0 gives the workers CUDA_VISIBLE_DEVICES=2,0 and gpu_ids all")

p = dry("--gpu_ids", "1,2", env=dict(env, CUDA_VISIBLE_DEVICES="4,5,6"))
if p.returncode != 0 or worker_env(p, 0).get("CUDA_VISIBLE_DEVICES") != "5,6":
    h.fail(f"--gpu_ids 1,2 under CUDA_VISIBLE_DEVICES=4,5,6: {p.stdout[-500:]} {p.stderr}")
print("ok: the ordinals count among the launcher's own visible GPUs (1,2 of 4,5,6 -> 5,6)")

p = dry("--gpu_ids", "0", env=env)
h.check_clean_failure(p, "--gpu_ids 0 for 2 processes", "two ranks would share a GPU")
p = dry("--gpu_ids", "0,3", env=dict(env, CUDA_VISIBLE_DEVICES="4,5"))
h.check_clean_failure(p, "--gpu_ids 0,3 of 2 visible", "is not among the 2 of CUDA_VISIBLE_DEVICES")
p = dry("--gpu_ids", "0,1", env=dict(env, CUDA_VISIBLE_DEVICES=""))
h.check_clean_failure(p, "--gpu_ids under an empty CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES is set and empty")
p = dry("--gpu_ids", "0,x", env=env)
h.check_clean_failure(p, "--gpu_ids 0,x", "is not a list of GPU ordinals")
p = dry("--cpu", "--gpu_ids", "0,1", env=env)
if p.returncode != 0 or "CUDA_VISIBLE_DEVICES" in p.stdout:
    h.fail(f"--cpu with --gpu_ids: the workers should see no CUDA_VISIBLE_DEVICES from it: {p.stdout[-500:]}")
print("launch gpu_ids: OK")
