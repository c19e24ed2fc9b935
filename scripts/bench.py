#!/usr/bin/env python3
"""`make bench`: hasten, the plain LibTorch loop and PyTorch (tests/integration/peers/torch_peer.py)
side by side on the workloads of docs/workloads.md, interleaved round by round (A B C A B C
...), then the collectives micro-benchmark. Prints markdown tables of medians and of ratios
taken within each round, and writes them with every raw record to <out>/.

    .venv/bin/python scripts/bench.py --build build [--repeats 3] [--workloads ...] [--modes ...]
    .venv/bin/python scripts/bench.py --build build --workloads --no-collectives --fashion-mnist [--fmnist-max-steps N]

Run it with the project's interpreter (.venv, made by `make deps`; `make bench` does): every
Python peer runs on the interpreter that runs this script (sys.executable), and the accelerate
peer under the accelerate installed beside it.

In the ddp2 modes a fourth side runs: the PyTorch DDP peer's loop through HuggingFace Accelerate
(scripts/accelerate_peer.py: Accelerator.prepare, accumulate, backward; the same seed, batches
and optimizer, losses bitwise the DDP peer's) under `accelerate launch`, 2 CPU processes on Gloo.

--hsdp adds the two-machine rows: hasten-example (mlp-large by default) on two loopback machines of
2 processes each (two `hasten launch --num_machines 2` agents, gloo), fsdp FULL_SHARD over all 4
against HYBRID_SHARD over a dp_replicate 2 x dp_shard 2 mesh, interleaved round by round:
steps/s and the payload bytes each rank hands to collectives across machines per step
(Accelerator::comm_stats). On one host "across machines" is loopback, so the bytes are the
figure that carries over to a real network; the speed is not.

--tp adds the tensor-parallel rows: hasten-char-lm (the char LM, widened: --tp-d-model) on 2
processes under ddp against the same model split over a tp 2 mesh (apps/examples/tp_gpt.hpp), the
same 16 windows a step, interleaved round by round: samples/s of the training loop and each
side's peak RSS (rank 0).

--big-model adds big-model inference (hasten/big_modeling.hpp): a 100 M-parameter gpt-tiny-shaped
model (403 MB of weights) built under EmptyWeights and dispatched whole into memory against a
100 MiB CPU budget with the other units streamed from disk (hasten-bench --big-model-run),
interleaved round by round: peak RSS, the forwards' time, and whether the logits agree.

--fashion-mnist adds the real-data row: hasten-fashion-mnist trained with DDP under `hasten
launch --num_processes 2` against scripts/fashion_mnist_torch.py (the same CNN, data order,
optimizer and schedule in PyTorch, DistributedDataParallel on Gloo, 2 processes): samples/s of
the training loops and the final test accuracy of each, interleaved round by round.

Every side runs with the same BLAS settings: one thread per process (OMP_NUM_THREADS=1 and the
peers' torch.set_num_threads(1), which in the wheel also sizes MKL's pool), and the settings
`hasten-bench --print-blas-env` prints (an OPENBLAS_CORETYPE where hasten's BLAS is OpenBLAS)."""
import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "tests", "integration", "peers", "torch_peer.py")
FMNIST_PEER = os.path.join(ROOT, "scripts", "fashion_mnist_torch.py")
ACCELERATE_PEER = os.path.join(ROOT, "scripts", "accelerate_peer.py")
# The venv's accelerate: the console script installed beside the interpreter running this.
ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")
PEER_MODES = {"single", "ddp2", "ddp2-accum4", "bf16"}
ACCELERATE_MODES = {"ddp2", "ddp2-accum4"}
LIBTORCH_MODES = {"single", "bf16"}
ALL_MODES = ["single", "bf16", "ddp2", "ddp2-accum4", "zero1", "zero2", "zero3", "fsdp"]
WORKLOADS = ["mlp-small", "gpt-tiny", "mlp-large"]


def run_json(cmd, env, log, timeout=3600):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"bench: error: {' '.join(cmd)} did not finish within {timeout} s", file=sys.stderr)
        return []
    log.write(f"$ {' '.join(cmd)}  ({time.monotonic() - t0:.1f} s, exit {p.returncode})\n{p.stderr[-2000:]}\n")
    if p.returncode != 0:
        print(f"bench: error: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return []
    out = []
    for line in p.stdout.splitlines():
        line = line.strip().removeprefix("[rank 0] ")  # hasten launch prefixes each rank's lines
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_command(workload, mode, steps):
    """`accelerate launch` of scripts/accelerate_peer.py on 2 CPU processes. --multi_gpu, not
    --cpu: `--cpu --num_processes 2` starts a single process (without mpirun); --multi_gpu starts
    2 with torchrun, and the script's Accelerator(cpu=True) keeps them on the CPU, on Gloo."""
    return [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            ACCELERATE_PEER, "--workload", workload, "--mode", mode, *steps]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, digits=1):
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def run_fashion_mnist(args, out_dir, env, log, raw):
    """hasten-fashion-mnist under hasten launch (ddp) and the PyTorch DDP script, the same
    settings (batch 64 per process, Adam 1e-3 with the half-cosine decay, seed 0, one thread per
    process), alternating round by round. Returns their JSON summaries."""
    n = str(args.fmnist_processes)
    common = ["--epochs", str(args.fmnist_epochs), "--max_steps", str(args.fmnist_max_steps), "--json"]
    records = []
    for r in range(args.repeats):
        project = os.path.join(out_dir, "fashion-mnist", f"round{r}")
        shutil.rmtree(project, ignore_errors=True)  # a fresh run, not a continuation of an old one
        hasten_program = [os.path.join(args.build, "bin", "hasten-fashion-mnist"), *common, "--quiet",
                          "--project_dir", project]
        if args.fmnist_processes > 1:
            hasten_cmd = [os.path.join(args.build, "bin", "hasten"), "launch", "--num_processes", n,
                          "--main_process_port", "0", "--strategy", "ddp", *hasten_program]
        else:
            hasten_cmd = hasten_program
        sides = [("hasten", hasten_cmd),
                 ("torch", [sys.executable, FMNIST_PEER, *common, "--num_processes", n])]
        for impl, cmd in sides:
            for rec in run_json(cmd, env, log):
                rec.update({"round": r, "impl": impl, "workload": "fashion-mnist"})
                records.append(rec)
                raw.write(json.dumps(rec) + "\n")
                raw.flush()
                print(f"  fashion-mnist x{n} {impl} round {r}: {rec['samples_per_s']:.0f} samples/s, "
                      f"test accuracy {rec['test_accuracy']:.4f}", file=sys.stderr)
    return records


def keep(records, raw, rec, **fields):
    """One run's record, labelled with `fields`: kept for the tables and written to results.jsonl."""
    rec.update(fields)
    records.append(rec)
    raw.write(json.dumps(rec) + "\n")
    raw.flush()


def run_hsdp(args, out_dir, env, log, raw):
    """fsdp FULL_SHARD vs HYBRID_SHARD on two loopback machines of 2 processes, round by round."""
    example = os.path.join(args.build, "bin", "hasten-example")
    hasten = os.path.join(args.build, "bin", "hasten")
    mesh = ["--set", "parallelism_config.parallelism_config_dp_replicate_size=2",
            "--set", "parallelism_config.parallelism_config_dp_shard_size=2"]
    sides = [("FULL_SHARD", ["--set", "strategy_options={sharding_strategy: FULL_SHARD}"]),
             ("HYBRID_SHARD", ["--set", "strategy_options={sharding_strategy: HYBRID_SHARD}", *mesh])]
    records = []
    for r in range(args.repeats):
        for name, extra in sides:
            port = str(free_port())
            cmds = [[hasten, "launch", "--num_machines", "2", "--machine_rank", str(m), "--num_processes", "4",
                     "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--strategy", "fsdp", example,
                     "--workload", args.hsdp_workload, "--steps", str(args.hsdp_steps), "--warmup", "2", "--units",
                     "--quiet", "--json", *extra] for m in (0, 1)]
            procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
            outs = [p.communicate(timeout=3600) for p in procs]
            log.write(f"$ {' '.join(cmds[0])}  (exit {procs[0].returncode}, {procs[1].returncode})\n{outs[0][1][-2000:]}\n")
            if any(p.returncode != 0 for p in procs):
                print(f"bench: error: hsdp {name} exited {[p.returncode for p in procs]}", file=sys.stderr)
                continue
            for line in outs[0][0].splitlines():
                line = line.strip().removeprefix("[rank 0] ")
                if line.startswith("{"):
                    rec = json.loads(line)
                    keep(records, raw, rec, round=r, impl="hasten", mode=name, workload=args.hsdp_workload)
                    print(f"  hsdp {name} round {r}: {rec['steps_per_s']:.2f} steps/s", file=sys.stderr)
    return records


def run_tp(args, out_dir, env, log, raw):
    """hasten-char-lm on 2 processes: ddp2 against tp 2, round by round."""
    char_lm = os.path.join(args.build, "bin", "hasten-char-lm")
    hasten = os.path.join(args.build, "bin", "hasten")
    common = ["--d_model", str(args.tp_d_model), "--n_layer", str(args.tp_n_layer), "--n_head", "8", "--context", "64",
              "--gradient_accumulation_steps", "1", "--max_steps", str(args.tp_steps),
              "--val_windows", "64", "--sample_chars", "0", "--warmup_steps", "0", "--quiet", "--json",
              "--project_dir", os.path.join(out_dir, "tp-runs")]
    # The same global batch of 16 windows a step: ddp's 2 processes read 8 each, tp's 2 both read 16.
    sides = [("ddp2", ["--batch_size", "8"]),
             ("tp2", ["--batch_size", "16", "--set", "parallelism_config.parallelism_config_tp_size=2"])]
    records = []
    for r in range(args.repeats):
        for name, extra in sides:
            shutil.rmtree(os.path.join(out_dir, "tp-runs"), ignore_errors=True)
            cmd = [hasten, "launch", "--num_processes", "2", "--strategy", "ddp", char_lm, *common, *extra]
            for rec in run_json(cmd, env, log):
                keep(records, raw, rec, round=r, impl="hasten", mode=name, workload="char-lm")
                print(f"  char-lm {name} round {r}: {rec['samples_per_s']:.1f} samples/s, "
                      f"peak RSS while training {rec['peak_rss_training_mb']:.0f} MiB", file=sys.stderr)
    return records


def run_big_model(args, out_dir, env, log, raw):
    """hasten-bench --big-model-run whole vs offload, round by round, on weights saved once."""
    bench = os.path.join(args.build, "bin", "hasten-bench")
    weights = os.path.join(out_dir, "big-model")
    shutil.rmtree(weights, ignore_errors=True)
    saved = run_json([bench, "--big-model-save", weights], env, log)
    records = []
    for r in range(args.repeats if saved else 0):
        for side in ("whole", "offload"):
            cmd = [bench, "--big-model-run", side, "--big-model-dir", weights, "--big-model-budget-mib",
                   str(args.big_model_budget_mib)]
            for rec in run_json(cmd, env, log):
                keep(records, raw, rec, round=r, impl="hasten", mode=side, workload="big-model",
                     model_bytes=saved[0]["bytes"])
                print(f"  big-model {side} round {r}: peak RSS {rec['peak_rss_mb']:.0f} MiB, "
                      f"forwards {rec['forward_seconds']:.2f} s", file=sys.stderr)
    shutil.rmtree(weights, ignore_errors=True)
    return records


def big_model_table(args, records):
    by = lambda name: {rec["round"]: rec for rec in records if rec["mode"] == name}
    whole, offload = by("whole"), by("offload")
    mb = records[0]["model_bytes"] / 1048576
    lines = [f"### Big-model inference: {mb:.0f} MiB of weights, 4 forwards (seq 64, batch 4) under NoGradGuard", "",
             "Peak RSS: the process's high-water mark (LibTorch's runtime included, about "
             f"{median([x['rss_before_model_mb'] for x in records]):.0f} MiB before the model); model's share: peak "
             "RSS less that.", "",
             "| side | units on disk | peak RSS MiB | model's share MiB | vs whole | forwards s | vs whole | logits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, runs in (("whole", whole), (f"offload ({args.big_model_budget_mib:g} MiB CPU budget)", offload)):
        if not runs:
            continue
        m = lambda k: median([x[k] for x in runs.values()])
        share = lambda x: x["peak_rss_mb"] - x["rss_before_model_mb"]
        vs = lambda f: median([f(runs[r]) / f(whole[r]) for r in runs if r in whole])
        same = all(runs[r]["logits_checksum"] == whole[r]["logits_checksum"] for r in runs if r in whole)
        lines.append(f"| {name} | {next(iter(runs.values()))['disk_units']} of {next(iter(runs.values()))['units']} | "
                     f"{fmt(m('peak_rss_mb'), 0)} | {fmt(median([share(x) for x in runs.values()]), 0)} | "
                     f"{fmt(vs(share), 2)} | {fmt(m('forward_seconds'), 2)} | "
                     f"{fmt(vs(lambda x: x['forward_seconds']), 2)} | {'the same' if same else 'DIFFER'} |")
    return lines + [""]


def tp_table(args, records):
    by = lambda name: {rec["round"]: rec for rec in records if rec["mode"] == name}
    ddp, tp = by("ddp2"), by("tp2")
    lines = [f"### char LM, width {args.tp_d_model}, {args.tp_n_layer} layers, context 64, 16 windows a step: "
             f"ddp on 2 processes vs tp 2 ({args.tp_steps} steps)", "",
             "Peak RSS: rank 0's high-water mark while training, before its first checkpoint (a save gathers "
             "whole tensors on rank 0); tp's includes the whole model it is split from, built first.", "",
             "| side | samples/s | vs ddp2 | peak RSS MiB while training (rank 0) | vs ddp2 | validation loss |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, runs in (("ddp2", ddp), ("tp2", tp)):
        if not runs:
            continue
        m = lambda k: median([x[k] for x in runs.values()])
        vs = lambda k: median([runs[r][k] / ddp[r][k] for r in runs if r in ddp])
        lines.append(f"| {name} | {fmt(m('samples_per_s'), 1)} | {fmt(vs('samples_per_s'), 2)} | "
                     f"{fmt(m('peak_rss_training_mb'), 0)} | {fmt(vs('peak_rss_training_mb'), 2)} | "
                     f"{fmt(m('val_loss'), 4)} |")
    return lines + [""]


def hsdp_table(args, records):
    steps = args.hsdp_steps + 2  # comm_stats counts the warm-up steps too
    lines = [f"### fsdp across two loopback machines x 2 processes, {args.hsdp_workload} (gloo)", "",
             "Bytes: rank 0's collective payload per step across machines (comm_stats, the warm-up steps and "
             "prepare's broadcast included, divided by all steps); speed: loopback, not a network.", "",
             "| sharding | steps/s | vs FULL_SHARD | across machines MB/step | of which gradients | all-gathers | "
             "within a machine MB/step | bytes across vs FULL_SHARD |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    by = lambda name: {rec["round"]: rec for rec in records if rec["mode"] == name}
    full, hybrid = by("FULL_SHARD"), by("HYBRID_SHARD")
    across = lambda rec: sum(rec["comm_bytes"]["across_machines"].values()) / steps / 1e6
    for name, runs in (("FULL_SHARD", full), ("HYBRID_SHARD", hybrid)):
        if not runs:
            continue
        one = next(iter(runs.values()))
        a = one["comm_bytes"]["across_machines"]
        grads = (a["reduce_scatter"] + a["allreduce"]) / steps / 1e6
        within = sum(one["comm_bytes"]["within_machine"].values()) / steps / 1e6
        speed = median([x["steps_per_s"] for x in runs.values()])
        vs = median([runs[r]["steps_per_s"] / full[r]["steps_per_s"] for r in runs if r in full])
        bytes_vs = median([across(runs[r]) / across(full[r]) for r in runs if r in full])
        lines.append(f"| {name} | {fmt(speed, 2)} | {fmt(vs, 2)} | {fmt(across(one), 3)} | {fmt(grads, 3)} | "
                     f"{fmt(a['allgather'] / steps / 1e6, 3)} | {fmt(within, 3)} | {fmt(bytes_vs, 3)} |")
    lines.append("")
    return lines


def fashion_mnist_table(args, records):
    by = lambda impl: {rec["round"]: rec for rec in records if rec["impl"] == impl}
    h, t = by("hasten"), by("torch")
    steps = sorted({rec["steps"] for rec in records})
    lines = [f"### fashion-mnist: {args.fmnist_processes} processes, batch 64 per process, "
             f"{args.fmnist_epochs} epoch(s), steps {'/'.join(map(str, steps))}", "",
             "| side | samples/s | test accuracy | test loss | eval count | train s | hasten / PyTorch samples/s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    ratio = median([h[r]["samples_per_s"] / t[r]["samples_per_s"] for r in h if r in t and t[r]["samples_per_s"] > 0])
    ddp = args.fmnist_processes > 1
    for name, side in (("hasten ddp" if ddp else "hasten", h), ("PyTorch DDP" if ddp else "PyTorch", t)):
        if not side:
            lines.append(f"| {name} | - | - | - | - | - | - |")
            continue
        m = lambda k: median([x[k] for x in side.values()])
        lines.append(f"| {name} | {fmt(m('samples_per_s'), 0)} | {fmt(m('test_accuracy'), 4)} | "
                     f"{fmt(m('test_loss'), 4)} | {'/'.join(str(x['eval_count']) for x in side.values())} | "
                     f"{fmt(m('train_seconds'))} | {fmt(ratio, 2) if side is h else ''} |")
    return lines + [""]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="*", default=WORKLOADS)
    ap.add_argument("--modes", nargs="*", default=ALL_MODES)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: each workload's S)")
    ap.add_argument("--no-collectives", action="store_true")
    ap.add_argument("--no-data-workers", action="store_true", help="skip the data-bound loop (DataLoader num_workers)")
    ap.add_argument("--fashion-mnist", action="store_true",
                    help="also hasten-fashion-mnist (ddp) vs scripts/fashion_mnist_torch.py (PyTorch DDP)")
    ap.add_argument("--hsdp", action="store_true",
                    help="also fsdp FULL_SHARD vs HYBRID_SHARD on two loopback machines x 2 processes")
    ap.add_argument("--hsdp-workload", default="mlp-large", help="hasten-example workload of the --hsdp rows")
    ap.add_argument("--hsdp-steps", type=int, default=10, help="timed steps of each --hsdp run")
    ap.add_argument("--tp", action="store_true", help="add the char LM's ddp2 vs tp 2 rows")
    ap.add_argument("--big-model", action="store_true", help="add big-model inference: whole vs streamed from disk")
    ap.add_argument("--big-model-budget-mib", type=float, default=100, help="--big-model: the CPU budget of the offload side")
    ap.add_argument("--tp-d-model", type=int, default=2048, help="width of the --tp rows' char LM")
    ap.add_argument("--tp-n-layer", type=int, default=2, help="layers of the --tp rows' char LM")
    ap.add_argument("--tp-steps", type=int, default=10, help="optimizer steps of each --tp run")
    ap.add_argument("--fmnist-epochs", type=int, default=1, help="Fashion-MNIST epochs (default 1)")
    ap.add_argument("--fmnist-max-steps", type=int, default=0, help="Fashion-MNIST step limit (0: the whole epochs)")
    ap.add_argument("--fmnist-processes", type=int, default=2, help="processes of each Fashion-MNIST side")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.fmnist_epochs < 1 or args.fmnist_max_steps < 0 or args.fmnist_processes < 1 or args.repeats < 1:
        ap.error("--repeats, --fmnist-epochs and --fmnist-processes expect whole numbers >= 1, --fmnist-max-steps >= 0")
    bench = os.path.join(args.build, "bin", "hasten-bench")
    out_dir = args.out or os.path.join(args.build, "bench")
    os.makedirs(out_dir, exist_ok=True)

    # The BLAS settings every side runs with.
    env = dict(os.environ, HASTEN_HOME=os.path.join(out_dir, "home"))
    blas = subprocess.run([bench, "--print-blas-env"], capture_output=True, text=True, env=env).stdout.splitlines()
    for line in blas:
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = v
    env.setdefault("OMP_NUM_THREADS", "1")
    # Every side on the CPU, also on a machine with GPUs: the peers here are CPU runs.
    env["HASTEN_USE_CPU"] = "true"
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    blas_line = [l[2:] for l in blas if l.startswith("# ")]
    settings = {k: env.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}

    # The accelerate side reads no accelerate config of the user's (~/.cache/huggingface): its
    # settings are all on its command line.
    accelerate_env = dict(env, HF_HOME=os.path.join(out_dir, "home", "huggingface"))
    with_accelerate = os.path.exists(ACCELERATE)
    if not with_accelerate and ACCELERATE_MODES & set(args.modes) and args.workloads:
        print(f"bench: warning: no accelerate beside {sys.executable} ({ACCELERATE}): the accelerate side is left "
              "out; run bench.py with the project's .venv/bin/python (`make deps`)", file=sys.stderr)

    records = []
    log = open(os.path.join(out_dir, "bench.log"), "w")
    raw = open(os.path.join(out_dir, "results.jsonl"), "w")  # every record as soon as it exists
    steps = ["--steps", str(args.steps)] if args.steps else []
    for w in args.workloads:
        # Round by round, every mode in each round: the sharded modes' ratios to ddp2 pair runs
        # made minutes apart at most, not a whole mode's rounds apart.
        for r in range(args.repeats):
            for mode in args.modes:
                sides = [("hasten", [bench, "--workload", w, "--mode", mode, "--impl", "hasten", "--quiet", *steps], env)]
                if mode in LIBTORCH_MODES:
                    sides.append(("libtorch", [bench, "--workload", w, "--mode", mode, "--impl", "libtorch", "--quiet", *steps],
                                  env))
                if mode in PEER_MODES:
                    sides.append(("torch", [sys.executable, PEER, "--workload", w, "--mode", mode, *steps], env))
                if mode in ACCELERATE_MODES and with_accelerate:
                    sides.append(("accelerate", accelerate_command(w, mode, steps), accelerate_env))
                for impl, cmd, side_env in sides:
                    for rec in run_json(cmd, side_env, log):
                        rec.update({"round": r, "impl": impl, "mode": mode, "workload": w})
                        records.append(rec)
                        raw.write(json.dumps(rec) + "\n")
                        raw.flush()
                        print(f"  {w} {mode} {impl} round {r}: {rec['steps_per_s']:.2f} steps/s", file=sys.stderr)
    fmnist = []
    if args.fashion_mnist:
        fmnist = run_fashion_mnist(args, out_dir, env, log, raw)
    hsdp = run_hsdp(args, out_dir, env, log, raw) if args.hsdp else []
    tp = run_tp(args, out_dir, env, log, raw) if args.tp else []
    big = run_big_model(args, out_dir, env, log, raw) if args.big_model else []
    collectives = []
    if not args.no_collectives:
        collectives += run_json([bench, "--collectives"], env, log)
        # The mpi plugin runs only in processes mpirun started (docs/launch.md, "Comm backends").
        mpi_plugin = os.path.join(args.build, "lib", "hasten", "plugins", "libhasten-comm-mpi.so")
        if shutil.which("mpirun") and os.path.exists(mpi_plugin):
            collectives += run_json(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", bench,
                                     "--collectives", "--comm", "mpi"], env, log)
        collectives += run_json([sys.executable, os.path.join(ROOT, "scripts", "bench_collectives_torch.py")], env, log)
    for rec in collectives:
        raw.write(json.dumps(rec) + "\n")
    data_workers = [] if args.no_data_workers else run_json([bench, "--data-workers"], env, log)
    for rec in data_workers:
        raw.write(json.dumps(rec) + "\n")
    raw.close()

    # Tables.
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; "
             f"BLAS: {blas_line[0] if blas_line else 'unknown'}; settings: {settings}; {args.repeats} rounds.", ""]
    for w in args.workloads:
        lines += [f"### {w}", "",
                  "| mode | hasten steps/s | plain LibTorch | PyTorch | accelerate | hasten / LibTorch | hasten / PyTorch | "
                  "hasten / accelerate | hasten / hasten ddp2 | peak RSS MiB (hasten, rank 0) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        ddp = {rec["round"]: rec["steps_per_s"] for rec in records
               if rec["workload"] == w and rec["mode"] == "ddp2" and rec["impl"] == "hasten"}
        for mode in args.modes:
            by = lambda impl: {rec["round"]: rec for rec in records if rec["workload"] == w and rec["mode"] == mode and rec["impl"] == impl}
            h, l, t, a = by("hasten"), by("libtorch"), by("torch"), by("accelerate")
            ratio = lambda other: median([h[r]["steps_per_s"] / other[r]["steps_per_s"] for r in h if r in other]) if other else None
            vs_ddp = (median([h[r]["steps_per_s"] / ddp[r] for r in h if r in ddp])
                      if mode in ("zero1", "zero2", "zero3", "fsdp") and ddp else None)
            rss = median([rec["peak_rss_mb"][0] for rec in h.values()]) if h else None
            lines.append(f"| {mode} | {fmt(median([x['steps_per_s'] for x in h.values()]))} | "
                         f"{fmt(median([x['steps_per_s'] for x in l.values()])) if l else '-'} | "
                         f"{fmt(median([x['steps_per_s'] for x in t.values()])) if t else '-'} | "
                         f"{fmt(median([x['steps_per_s'] for x in a.values()])) if a else '-'} | "
                         f"{fmt(ratio(l), 2) if l else '-'} | {fmt(ratio(t), 2) if t else '-'} | "
                         f"{fmt(ratio(a), 2) if a else '-'} | "
                         f"{fmt(vs_ddp, 2) if vs_ddp else '-'} | {fmt(rss)} |")
        lines.append("")
    if fmnist:
        lines += fashion_mnist_table(args, fmnist)
    if hsdp:
        lines += hsdp_table(args, hsdp)
    if tp:
        lines += tp_table(args, tp)
    if big:
        lines += big_model_table(args, big)
    if collectives:
        lines += ["### Collectives, 2 ranks, float32 (GB/s = bytes per rank / median time of the slowest rank)", "",
                  "copy ms: a plain memcpy of the bytes each rank must move (allreduce: its buffer; allgather: the "
                  "2 x bytes of output; reduce_scatter: its whole input), every rank at once, timed in the same "
                  "run as shm, interleaved with it. cpu: the same in the calling thread's CPU time (shm's waits "
                  "sleep, so this is its copying and reducing; a loaded machine stretches wall time, not this).", "",
                  "| op | bytes | shm | gloo plugin | mpi plugin | c10d ProcessGroupGloo | shm ms | copy ms | shm / copy | "
                  "shm cpu ms | copy cpu ms | cpu shm / copy | gloo plugin ms | mpi plugin ms | c10d ms |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        get = lambda comm, op, b: next((c for c in collectives if c.get("comm") == comm and c["op"] == op and c["bytes"] == b), None)
        for op in ("allreduce", "allgather", "reduce_scatter"):
            for b in sorted({c["bytes"] for c in collectives if c["op"] == op}):
                s, g, m, c = get("shm", op, b), get("gloo", op, b), get("mpi", op, b), get("c10d-gloo", op, b)
                cell = lambda x, k: "unsupported" if x and "unsupported" in x else fmt(x[k], 3) if x else "-"
                lines.append(f"| {op} | {b} | {cell(s, 'gb_per_s')} | {cell(g, 'gb_per_s')} | {cell(m, 'gb_per_s')} | "
                             f"{cell(c, 'gb_per_s')} | "
                             f"{cell(s, 'median_ms')} | {cell(s, 'copy_ms')} | {cell(s, 'vs_copy')} | "
                             f"{cell(s, 'cpu_ms')} | {cell(s, 'copy_cpu_ms')} | {cell(s, 'cpu_vs_copy')} | "
                             f"{cell(g, 'median_ms')} | {cell(m, 'median_ms')} | {cell(c, 'median_ms')} |")
    if data_workers:
        lines += ["### Data-bound loop: DataLoader num_workers", "",
                  f"A dataset whose get() costs {data_workers[0]['get_us']:.0f} us of CPU per sample (measured in the "
                  f"run), batches of {data_workers[0]['batch_size']}, a step far cheaper than reading the batch; the "
                  "checksum of every batch is the same for each row.", "",
                  "| num_workers | samples/s | vs 0 workers |", "| --- | --- | --- |"]
        base = data_workers[0]["samples_per_s"]
        for rec in data_workers:
            lines.append(f"| {rec['num_workers']} | {fmt(rec['samples_per_s'], 0)} | {fmt(rec['samples_per_s'] / base, 2)} |")
        lines.append("")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "benchmarks.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
