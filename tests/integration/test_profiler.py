"""The config key `profile`: LibTorch's profiler over a window of optimizer steps on every rank.
hasten-example under ddp on 2 processes with `--set profile={wait: 1, warmup: 1, active: 3,
dir: D}` writes one Chrome trace per rank (D/<host>_rank<R>.pt.trace.json); each holds exactly
the 3 recorded optimizer steps (hasten::optimizer_step ranges), hasten's other phases
(hasten::forward, hasten::backward, hasten::data_wait, the gradient allreduce the ddp plugin
issues through the host), and hasten's ranges nest on each thread (any two are disjoint or one
holds the other; the allreduces lie inside a backward). A field the key does not have is one
line naming the allowed ones."""
import json
import os
import socket
import tempfile

import harness as h

EXAMPLE = os.path.join(h.BIN, "hasten-example")

with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "profile")
    p = h.run(h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", EXAMPLE, "--workload", "mlp-small",
                       "--steps", "8", "--warmup", "0", "--log-every", "0", "--quiet", "--set",
                       f"profile={{wait: 1, warmup: 1, active: 3, dir: {out}}}"), check=True)
    host = socket.gethostname()
    for rank in (0, 1):
        path = os.path.join(out, f"{host}_rank{rank}.pt.trace.json")
        if not os.path.isfile(path):
            h.fail(f"no trace for rank {rank} at {path}: {os.listdir(out) if os.path.isdir(out) else 'no directory'}\n"
                   f"{p.stderr}")
        with open(path) as f:
            trace = json.load(f)
        events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
        hasten = [e for e in events if str(e.get("name", "")).startswith("hasten::")]
        names = {e["name"] for e in hasten}
        for want in ("hasten::forward", "hasten::backward", "hasten::optimizer_step", "hasten::data_wait",
                     "hasten::allreduce"):
            if want not in names:
                h.fail(f"rank {rank}'s trace has no {want} range (it has {sorted(names)})")
        steps = [e for e in hasten if e["name"] == "hasten::optimizer_step"]
        if len(steps) != 3:
            h.fail(f"rank {rank}: {len(steps)} optimizer steps recorded, the window is active: 3")
        # Nesting, thread by thread: two ranges either do not overlap or one holds the other.
        by_thread = {}
        for e in hasten:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        for thread, ranges in by_thread.items():
            ranges.sort(key=lambda e: (e["ts"], -e["dur"]))
            open_ranges = []
            for e in ranges:
                while open_ranges and open_ranges[-1]["ts"] + open_ranges[-1]["dur"] <= e["ts"]:
                    open_ranges.pop()
                if open_ranges and e["ts"] + e["dur"] > open_ranges[-1]["ts"] + open_ranges[-1]["dur"] + 1:
                    h.fail(f"rank {rank}: {e['name']} at {e['ts']} (+{e['dur']}) overlaps {open_ranges[-1]['name']} "
                           f"at {open_ranges[-1]['ts']} (+{open_ranges[-1]['dur']}) without nesting")
                open_ranges.append(e)
        backward = [e for e in hasten if e["name"] == "hasten::backward"]
        inside = [a for a in hasten if a["name"] == "hasten::allreduce" and any(
            b["tid"] == a["tid"] and b["ts"] <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"] + 1 for b in backward)]
        if not inside:
            h.fail(f"rank {rank}: no gradient allreduce inside a backward")
        print(f"ok: rank {rank}: {len(events)} events, {len(hasten)} hasten ranges ({len(steps)} steps, "
              f"{len(inside)} allreduces inside backward), nested")

    # A misspelt field: one line with the allowed ones.
    bad = h.run([EXAMPLE, "--workload", "mlp-small", "--steps", "1", "--quiet", "--set", "profile={steps: 3}"])
    h.check_clean_failure(bad, "profile with an unknown field", "unknown field 'steps' (allowed: wait, warmup, active, dir)")
    bad = h.run([EXAMPLE, "--workload", "mlp-small", "--steps", "1", "--quiet", "--set", "profile.active=0"])
    h.check_clean_failure(bad, "profile.active 0", "active must be an integer from 1")
print("profiler: OK")
