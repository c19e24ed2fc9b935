#!/usr/bin/env python3
"""c10d's ProcessGroupGloo on the same buffers as `hasten-bench --collectives`: allreduce,
allgather and reduce_scatter of 4 KiB to 64 MiB float32 between 2 processes; one JSON line per
(op, size) with the median time of the slowest rank. Run with the project's interpreter:

    .venv/bin/python scripts/bench_collectives_torch.py [MAX_BYTES]"""
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def worker(rank, world, max_bytes):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=10))
    for op in ("allreduce", "allgather", "reduce_scatter"):
        size = 4096
        while size <= max_bytes:
            n = size // 4
            t = torch.ones(n)
            outs = [torch.empty(n) for _ in range(world)]
            chunks = list(torch.ones(n).chunk(world))
            out = torch.empty(n // world)

            def once():
                if op == "allreduce":
                    dist.all_reduce(t)
                elif op == "allgather":
                    dist.all_gather(outs, t)
                else:
                    dist.reduce_scatter(out, chunks)

            try:
                c0 = time.perf_counter()
                for _ in range(3):
                    once()
            except RuntimeError as e:  # a ProcessGroupGloo without it (torch 1.13's had no reduce_scatter)
                if rank == 0:
                    print(json.dumps({"impl": "torch", "comm": "c10d-gloo", "op": op, "bytes": size,
                                      "unsupported": str(e).splitlines()[0]}), flush=True)
                break
            # Every rank runs the same number of iterations: the largest wish.
            each = (time.perf_counter() - c0) / 3
            wish = torch.tensor([min(200, max(5, int(0.3 / max(each, 1e-7))))])
            dist.all_reduce(wish, op=dist.ReduceOp.MAX)
            times = []
            for _ in range(int(wish)):
                dist.barrier()
                t0 = time.perf_counter()
                once()
                times.append(time.perf_counter() - t0)
            mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            if rank == 0:
                s = float(mine)
                print(json.dumps({"impl": "torch", "comm": "c10d-gloo", "op": op, "bytes": size,
                                  "median_ms": s * 1e3, "gb_per_s": size / s / 1e9, "iterations": len(times),
                                  "world_size": world}), flush=True)
            size *= 4
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    max_bytes = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), max_bytes)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, str(max_bytes)],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port)))
             for r in range(2)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
