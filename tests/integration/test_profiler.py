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
import subprocess
import tempfile

import harness as h

EXAMPLE = os.path.join(h.BIN, "hasten-example")
SERVICES_PY = os.path.join(os.environ["HASTEN_TEST_SERVICES_VENV"], "bin", "python")
if not os.path.exists(SERVICES_PY):
    h.fail(f"no {SERVICES_PY}: run `make deps` (scripts/install-deps.sh makes .venv-services)")
# torch-tb-profiler's loading of one worker's trace: RunProfileData.parse, process, analyze,
# then RunGenerator's run profile (what its TensorBoard tab shows).
PLUGIN_READER = r"""
import glob, json, os, sys, tempfile
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator
[path] = glob.glob(os.path.join(sys.argv[1], "*.pt.trace.json"))
worker = os.path.basename(path)[:-len(".pt.trace.json")]
with tempfile.TemporaryDirectory() as cache:
    data = RunProfileData.parse(worker, None, path, cache)
    data.process()
    data.analyze()
    profile = RunGenerator(worker, None, data).generate_run_profile()
names = set()
for row in profile.operation_table_by_name["data"]:
    names.add(row["name"])
print(json.dumps({"views": [v.display_name for v in profile.views], "steps": [r[0] for r in profile.overview["steps"]["rows"]],
                  "operators": sorted(names)}))
"""

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

    # The char LM's profile, read by TensorBoard's PyTorch profiler plugin (torch-tb-profiler,
    # from .venv-services): its own parser and run generator, as its PYTORCH_PROFILER tab loads
    # a run; the steps it finds are the window's active ones (hasten's ProfilerStep#N markers).
    plugin_dir = os.path.join(d, "char-lm-profile")
    p = h.run([os.path.join(h.BIN, "hasten-char-lm"), "--d_model", "64", "--n_layer", "2", "--n_head", "4",
               "--context", "32", "--batch_size", "8", "--val_windows", "64", "--max_steps", "8", "--quiet", "--json",
               "--project_dir", os.path.join(d, "char-lm"), "--set",
               f"profile={{wait: 2, warmup: 1, active: 4, dir: {plugin_dir}}}"], timeout=600)
    if p.returncode != 0:
        h.fail(f"hasten-char-lm with a profile exited {p.returncode}:\n{p.stderr[-3000:]}")
    reader = subprocess.run([SERVICES_PY, "-c", PLUGIN_READER, plugin_dir], capture_output=True, text=True, timeout=300)
    if reader.returncode != 0:
        h.fail(f"TensorBoard's profiler plugin could not load the char LM's profile:\n{reader.stderr[-3000:]}")
    got = json.loads(reader.stdout.strip().splitlines()[-1])
    if got["views"][:2] != ["Overview", "Operator"] or "Trace" not in got["views"]:
        h.fail(f"the plugin's views of the char LM's profile: {got['views']}")
    if got["steps"] != ["3", "4", "5", "6"]:
        h.fail(f"the plugin found steps {got['steps']} in the char LM's profile (want the 4 active ones, 3 to 6)")
    if not {"aten::addmm", "aten::_log_softmax_backward_data"} <= set(got["operators"]):
        h.fail(f"the plugin's operator table of the char LM's profile: {got['operators'][:20]}")
    print(f"ok: TensorBoard's profiler plugin loads the char LM's profile: steps {got['steps']}, "
          f"{len(got['operators'])} operators")

    # A misspelt field: one line with the allowed ones.
    bad = h.run([EXAMPLE, "--workload", "mlp-small", "--steps", "1", "--quiet", "--set", "profile={steps: 3}"])
    h.check_clean_failure(bad, "profile with an unknown field", "unknown field 'steps' (allowed: wait, warmup, active, dir)")
    bad = h.run([EXAMPLE, "--workload", "mlp-small", "--steps", "1", "--quiet", "--set", "profile.active=0"])
    h.check_clean_failure(bad, "profile.active 0", "active must be an integer from 1")
print("profiler: OK")
