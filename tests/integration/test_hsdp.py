"""HSDP: zero and fsdp over a device mesh of dp_replicate 2 x dp_shard 2 (parallelism_config)
shard within each dp_shard group and replicate across dp_replicate (sharded_strategy.hpp):
- on one machine (4 processes, shm) zero1, zero2, zero3 and fsdp FULL_SHARD, with gradient
  accumulation and clip_grad_norm_, train to ddp's losses and final parameters on 4 processes
  (within 1e-6 relative: the sums run in another order, two groups of two instead of four);
- on two machines over loopback (two `hasten launch --num_machines 2` agents, 2 processes
  each, gloo), fsdp HYBRID_SHARD and HYBRID_SHARD_ZERO2 do the same, and say HSDP in the log;
  the gradient bytes they hand to collectives across machines (Accelerator::comm_stats) are 1/2
  (1 / processes per machine) of plain FULL_SHARD's over both machines, and no parameter
  all-gather crosses machines;
- a checkpoint of an HSDP run resumes to the straight run's parameters bit for bit, and one of
  plain zero3 on 4 processes loads under HSDP (the pieces resharded) to the same result;
- HYBRID_SHARD across machines without that mesh is one line naming the sizes to set."""
import json
import os
import shutil
import socket
import subprocess
import tempfile

import harness as h

ARGS = ["--workload", "mlp-small", "--warmup", "0", "--steps", "20", "--units", "--log-every", "0", "--quiet"]
MESH = ["--set", "parallelism_config.parallelism_config_dp_replicate_size=2",
        "--set", "parallelism_config.parallelism_config_dp_shard_size=2"]
HYBRID = "strategy_options={sharding_strategy: %s}"


def read(path):
    with open(path) as f:
        return json.load(f)["losses"]


def params(path):
    import numpy as np
    import struct
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return {k: np.frombuffer(blob[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]], dtype=np.float32)
            for k, e in header.items() if k != "__metadata__"}


def one_machine(d, tag, strategy, extra=(), resume=False):
    out = os.path.join(d, tag)
    cmd = h.hasten("launch", "--num_processes", "4", "--main_process_port", "0", "--strategy", strategy,
                   h.example()[0], *ARGS, "--params-out", out + ".st", "--losses-out", out + ".json", *extra)
    p = h.run(cmd + (["--resume"] if resume else []), check=True, timeout=600)
    return read(out + ".json"), params(out + ".st"), p.stdout + p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_two_machines(strategy, program_args):
    """Two `hasten launch --num_machines 2` agents of 2 processes each on this host."""
    port = free_port()
    return [subprocess.Popen(
        h.hasten("launch", "--num_machines", "2", "--machine_rank", str(r), "--num_processes", "4",
                 "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--strategy", strategy,
                 h.example()[0], *ARGS, *program_args),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]


def two_machines(d, tag, strategy, extra=()):
    """(losses, final parameters, both machines' output); rank 0's JSON summary in summaries[tag]."""
    out = os.path.join(d, tag)
    machines = start_two_machines(strategy, ["--json", "--params-out", out + ".st", "--losses-out", out + ".json", *extra])
    logs = []
    for r, m in enumerate(machines):
        o, e = m.communicate(timeout=600)
        if m.returncode != 0:
            for other in machines:
                other.kill()
            h.fail(f"{tag}: machine {r} exited {m.returncode}:\n{o}\n{e}")
        logs.append(o + e)
    for line in logs[0].splitlines():
        if line.removeprefix("[rank 0] ").startswith("{"):
            summaries[tag] = json.loads(line.removeprefix("[rank 0] "))
    return read(out + ".json"), params(out + ".st"), "\n".join(logs)


def close(what, reference, candidate, tolerance=1e-6):
    (l0, p0, _), (l1, p1, _) = reference, candidate
    if len(l0) != len(l1):
        h.fail(f"{what}: {len(l1)} losses, ddp has {len(l0)}")
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(l0, l1))
    if worst > tolerance:
        h.fail(f"{what}: losses differ from ddp's by up to {worst:.3g} relative ({l0} vs {l1})")
    if sorted(p0) != sorted(p1):
        h.fail(f"{what}: parameter names {sorted(p1)}, ddp's {sorted(p0)}")
    pworst = max(float(abs(p0[k] - p1[k]).max()) for k in p0)
    if pworst > 1e-5:
        h.fail(f"{what}: final parameters differ from ddp's by up to {pworst:.3g}")
    print(f"ok: {what}: losses within {worst:.2g} relative of ddp's, parameters within {pworst:.2g}")


def bitwise(what, a, b):
    if a[0] != b[0] or any((a[1][k] != b[1][k]).any() for k in a[1]):
        h.fail(f"{what}: not bit for bit")
    print(f"ok: {what}: bit for bit")


summaries = {}
with tempfile.TemporaryDirectory() as d:
    os.environ["HASTEN_HOME"] = os.path.join(d, "home")
    for accum in ([], ["--gradient_accumulation_steps", "2", "--clip", "1.0"]):
        label = " accum2 clip1" if accum else ""
        ddp = one_machine(d, "ddp" + label, "ddp", accum)
        for strategy, extra in (("zero1", []), ("zero2", []), ("zero3", []), ("fsdp", ["--set", HYBRID % "FULL_SHARD"])):
            run = one_machine(d, strategy + label, strategy, [*MESH, *extra, *accum])
            if "HSDP: shards within dp_shard groups of 2 ranks, replicated across 2" not in run[2]:
                h.fail(f"{strategy}{label}: the log does not say HSDP:\n{run[2]}")
            close(f"{strategy} on a 2 x 2 mesh, one machine{label}", ddp, run)
        if not accum:
            for name in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
                run = two_machines(d, name, "fsdp", [*MESH, "--set", HYBRID % name])
                if "HSDP: shards within dp_shard groups of 2 ranks" not in run[2]:
                    h.fail(f"{name} on 2 machines: the log does not say HSDP:\n{run[2]}")
                close(f"fsdp {name} on 2 machines x 2 processes", ddp, run)
            # The bytes that cross machines (Accelerator::comm_stats, rank 0, the training loop):
            # plain FULL_SHARD over both machines reduce-scatters every gradient and all-gathers
            # every parameter across them; HSDP sends across only its gradient shard's sum.
            close("fsdp FULL_SHARD on 2 machines x 2 processes",
                  ddp, two_machines(d, "FULL_SHARD", "fsdp", ["--set", HYBRID % "FULL_SHARD"]))
            full, hsdp = summaries["FULL_SHARD"]["comm_bytes"], summaries["HYBRID_SHARD"]["comm_bytes"]
            fa, ha = full["across_machines"], hsdp["across_machines"]
            if ha["allgather"] != 0 or ha["reduce_scatter"] != 0:
                h.fail(f"HSDP all-gathered or reduce-scattered across machines: {hsdp}")
            if fa["allgather"] == 0 or fa["reduce_scatter"] == 0:
                h.fail(f"FULL_SHARD over 2 machines shows no cross-machine all-gather or reduce-scatter: {full}")
            ratio = ha["allreduce"] / fa["reduce_scatter"]
            if not 0.49 <= ratio <= 0.51:
                h.fail(f"HSDP's gradient bytes across machines are {ratio:.3f} of FULL_SHARD's (want 1/2): {hsdp} vs {full}")
            if ha["broadcast"] != fa["broadcast"]:
                h.fail(f"prepare's broadcast differs: {ha['broadcast']} vs {fa['broadcast']}")
            steps = 20
            total_full = (fa["allreduce"] + fa["allgather"] + fa["reduce_scatter"]) / steps
            total_hsdp = (ha["allreduce"] + ha["allgather"] + ha["reduce_scatter"]) / steps
            print(f"ok: bytes across machines per step (rank 0, payload): FULL_SHARD {total_full / 1e6:.3f} MB "
                  f"(reduce-scatter {fa['reduce_scatter'] / steps / 1e6:.3f}, all-gather {fa['allgather'] / steps / 1e6:.3f}), "
                  f"HSDP {total_hsdp / 1e6:.3f} MB (gradient-shard allreduce {ha['allreduce'] / steps / 1e6:.3f}); "
                  f"gradients {ratio:.3f} of FULL_SHARD's, everything {total_hsdp / total_full:.3f}")

    # Checkpoints: an HSDP run's resumes bit for bit; a plain zero3 run's loads under HSDP.
    straight = one_machine(d, "straight", "zero3", [*MESH, "--project_dir", os.path.join(d, "p"), "--checkpoint_every", "10"])
    shutil.copytree(os.path.join(d, "p"), os.path.join(d, "q"))
    shutil.rmtree(os.path.join(d, "q", "checkpoints", "checkpoint_1"))
    resumed = one_machine(d, "resumed", "zero3", [*MESH, "--project_dir", os.path.join(d, "q"), "--checkpoint_every", "10"],
                          resume=True)
    if "resumed at step 10" not in resumed[2]:
        h.fail(f"the HSDP run did not resume at step 10:\n{resumed[2]}")
    # The resumed run reports the steps it ran: the last 10.
    bitwise("zero3 HSDP resumed from its step-10 checkpoint vs straight", (straight[0][-10:], straight[1]),
            (resumed[0][-10:], resumed[1]))
    plain = one_machine(d, "plain", "zero3", ["--project_dir", os.path.join(d, "r"), "--checkpoint_every", "10"])
    shutil.rmtree(os.path.join(d, "r", "checkpoints", "checkpoint_1"))
    hybrid = one_machine(d, "plain_then_hsdp", "zero3", [*MESH, "--project_dir", os.path.join(d, "r"),
                                                          "--checkpoint_every", "10"], resume=True)
    close("plain zero3's step-10 checkpoint resumed under HSDP", plain, (plain[0][:10] + hybrid[0][-10:], hybrid[1], ""))

    # HYBRID_SHARD across machines needs the mesh: one line naming the sizes.
    machines = start_two_machines("fsdp", ["--set", HYBRID % "HYBRID_SHARD"])
    outs = [m.communicate(timeout=300) for m in machines]
    if machines[0].returncode == 0:
        h.fail("HYBRID_SHARD across 2 machines without a mesh was accepted")
    want = "set parallelism_config's parallelism_config_dp_replicate_size to 2 (the machines) and " \
           "parallelism_config_dp_shard_size to 2"
    if want not in outs[0][1]:
        h.fail(f"HYBRID_SHARD without a mesh: machine 0 does not say '{want}':\n{outs[0][1]}")
    print("ok: HYBRID_SHARD across 2 machines without the mesh: one line naming the sizes")
print("OK")
