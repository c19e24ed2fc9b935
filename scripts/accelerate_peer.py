#!/usr/bin/env python3
"""The PyTorch DDP peer's loop (tests/integration/peers/torch_peer.py) through HuggingFace
Accelerate: the same workload, seed, batches and optimizer, with the model and optimizer given
to `Accelerator.prepare`, each micro-batch under `accelerator.accumulate(model)` and
`accelerator.backward(loss)`. `make bench` (scripts/bench.py) times it beside the DDP peer in
the ddp2 modes. Run it under the .venv's accelerate, from the repository root:

    .venv/bin/accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no --main_process_port PORT scripts/accelerate_peer.py --workload mlp-small --mode ddp2

--multi_gpu, not --cpu: `accelerate launch --cpu --num_processes 2` starts one process (without
an mpirun hostfile it runs the script once, undistributed); --multi_gpu starts the processes with
torchrun, and the script's Accelerator(cpu=True) keeps them on the CPU (DistributedType.MULTI_CPU,
Gloo) whether or not the machine has GPUs. A run whose process count is not its mode's is refused.

The options are torch_peer.py's (--workload, --mode, --steps, --warmup, --batch, --losses-out,
--trace-out, --gpt-shape); modes: ddp2 and ddp2-accum4 (2 processes; accumulate with
gradient_accumulation_steps 4, which skips the all-reduce on micro-batches 1-3 as no_sync()
does and divides the loss by 4 in backward), single and single-accum4 (one process, e.g.
`accelerate launch --cpu --num_processes 1`); not bf16 (Accelerate's autocast is not the peer's).

What DDP runs is the same: Accelerate wraps the model in DistributedDataParallel with its
defaults; each rank cuts its slice of the global batch as the DDP peer does (no prepared
DataLoader, whose sharding and order would differ). Rank 0 prints the DDP peer's JSON summary
line with impl "accelerate" and the accelerate version; --losses-out's file compares with the
DDP peer's bitwise.

--device {cpu,cuda} (default cpu; this script's own option, not torch_peer.py's): cuda makes
it Accelerator(cpu=False), so each process runs on accelerator.device (the GPU of
its LOCAL_RANK, NCCL between processes), for timing the same loop on GPUs beside hasten
(scripts/gpu-check.sh; one process: `accelerate launch --num_processes 1 --num_machines 1
--mixed_precision no --dynamo_backend no scripts/accelerate_peer.py --device cuda --workload
gpt-tiny --mode single`). The data set is built on the CPU from the same seed, and each batch
is copied to accelerator.device as it is cut (as a prepared DataLoader sends its batches, with
blocking copies); the gpt-tiny model's mask and positions (plain tensors, not buffers, which
prepare() does not move) are moved with the model. The timed steps begin and end with
torch.cuda.synchronize(). The summary names the device ("device", also on the CPU) and on a
GPU its name ("gpu") and peak memory ("peak_gpu_mb", torch.cuda.max_memory_allocated). Not with --trace-out (its records are written
from CPU tensors). The losses are the GPU's (cuBLAS, cuDNN), not bitwise the CPU peer's.
"""
import argparse
import datetime
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "peers"))

import accelerate  # noqa: E402
import torch  # noqa: E402
from accelerate import Accelerator, InitProcessGroupKwargs  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402

import torch_peer as tp  # noqa: E402
from peer_workloads import MODES, WORKLOADS, make_optimizer  # noqa: E402


def die(message):
    print(f"accelerate_peer: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def move_plain_tensors(model, device):
    """Moves the tensors modules keep as plain attributes (gpt-tiny's causal mask and positions:
    not buffers, so that DDP does not broadcast them), which model.to() and prepare() leave
    where they are."""
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                setattr(module, name, value.to(device))


def train(args, accelerator):
    """The DDP peer's train() through Accelerate; returns (per-step losses, timed seconds, CPU
    snapshots)."""
    workload = WORKLOADS[args.workload]
    rank, world = accelerator.process_index, accelerator.num_processes
    cuda = args.device == "cuda"
    torch.manual_seed(0)  # the model, then the data, from this seed (docs/workloads.md)
    model, data = workload.build()
    args.params = sum(p.numel() for p in model.parameters())
    if cuda:
        move_plain_tensors(model, accelerator.device)
    optimizer = make_optimizer(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)  # the model to accelerator.device

    def sync():
        if cuda:
            torch.cuda.synchronize(accelerator.device)

    losses = []
    trace = tp.Trace(args.trace_out if rank == 0 else None)
    start = cpu_start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync()
            cpu_start, start = tp.cpu_times(), time.perf_counter()
        inputs, target = workload.batch_at(data, step, args.batch, world, rank)
        if cuda:  # as a prepared DataLoader sends each batch to the device
            inputs, target = inputs.to(accelerator.device), target.to(accelerator.device)
        # Syncs (all-reduces, steps, zeroes) on every gradient_accumulation_steps-th micro-batch,
        # counted from the first: the DDP peer's (step + 1) % accumulation == 0.
        with accelerator.accumulate(model):
            loss = workload.loss(model(inputs), target)
            accelerator.backward(loss)  # loss / gradient_accumulation_steps
            trace.grads(model.parameters())
            optimizer.step()  # only where the micro-batch syncs
            trace.params(model.parameters())
            optimizer.zero_grad(set_to_none=False)  # only where it syncs; in place, as the DDP peer
        losses.append(loss.detach())
    sync()
    end = time.perf_counter()
    cpu_end = tp.cpu_times()
    if start is None:  # no timed steps
        start, cpu_start = end, cpu_end
    return torch.stack(losses), end - start, (cpu_start, cpu_end)


def parse_args():
    """torch_peer.py's options plus this script's --device."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    mine, rest = own.parse_known_args()
    args = tp.parse_args(rest, description="Train a hasten benchmark workload through HuggingFace Accelerate "
                                           "(run under accelerate launch). Also takes --device {cpu,cuda} "
                                           "(default cpu): cuda runs each process on accelerator.device, "
                                           "Accelerator(cpu=False).")
    args.device = mine.device
    return args


def main():
    args = parse_args()
    mode = MODES[args.mode]
    if mode.bf16:
        die(f"--mode {args.mode} is not supported here (Accelerate's autocast is not the DDP peer's); "
            "modes: " + ", ".join(m for m in MODES if not MODES[m].bf16))
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        die(f"--device cuda: torch {torch.__version__} sees no CUDA device "
            f"(built with CUDA {torch.version.cuda or 'none'}, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})")
    if cuda and args.trace_out:
        die("--trace-out is not supported with --device cuda (its records are written from CPU tensors)")
    accelerator = Accelerator(cpu=not cuda, gradient_accumulation_steps=mode.accumulation, mixed_precision="no",
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(minutes=10))])
    world, rank = accelerator.num_processes, accelerator.process_index
    if world != mode.world_size:
        if mode.world_size > 1:
            how = ("`accelerate launch --multi_gpu --num_processes 2 ...`"
                   + ("" if cuda else " (`--cpu --num_processes 2` starts one process)"))
        else:
            how = "`accelerate launch --num_processes 1 ...`" if cuda else "`accelerate launch --cpu --num_processes 1 ...`"
        die(f"--mode {args.mode} runs {mode.world_size} process(es), accelerate started {world}: launch it with {how}")
    if cuda and accelerator.device.type != "cuda":
        die(f"--device cuda: accelerate placed this process on {accelerator.device}")
    torch.set_num_threads(1)  # one intra-op thread per process, as hasten's runs and the DDP peer
    tp.set_blas_threads(1)

    losses, timed_s, (cpu_start, cpu_end) = train(args, accelerator)
    mine = (tp.peak_rss_mb(), cpu_end[1] - cpu_start[1])
    losses = losses.double()  # averaged in double, as the DDP peer and hasten-example do
    if world > 1:
        losses = accelerator.reduce(losses, reduction="mean")  # all_reduce (sum), then / world
        per_rank = gather_object([mine])
    else:
        per_rank = [mine]

    if accelerator.is_main_process:
        losses = [float(x) for x in losses.tolist()]
        steps_per_s = args.steps / timed_s if args.steps and timed_s > 0 else 0.0
        others = cpu_end[0] - cpu_start[0] - sum(cpu for _, cpu in per_rank)
        summary = {
            "impl": "accelerate", "workload": args.workload, "mode": args.mode,
            "steps_per_s": steps_per_s, "samples_per_s": steps_per_s * args.batch * world,
            "peak_rss_mb": [round(rss, 1) for rss, _ in per_rank], "params": args.params,
            "final_loss": losses[-1], "losses_first5": losses[:5],
            "samples_per_s_per_rank": steps_per_s * args.batch, "B": args.batch, "world_size": world,
            "S": args.steps, "warmup": args.warmup, "timed_s": timed_s, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "accelerate": accelerate.__version__, "blas": tp.blas_library(),
            "blas_threads": tp.blas_threads(),
            "other_cpu_cores": round(max(0.0, others / timed_s) if timed_s > 0 else 0.0, 3),
            "device": str(accelerator.device),
        }
        if cuda:
            summary["gpu"] = torch.cuda.get_device_name(accelerator.device)
            summary["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(accelerator.device) / 2**20, 1)
        print(json.dumps(summary), flush=True)
        tp.write_losses(args, "accelerate", losses)
    if world > 1:
        accelerator.wait_for_everyone()
        tp.leave_without_teardown()


if __name__ == "__main__":
    main()
