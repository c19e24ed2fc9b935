"""hasten estimate-memory:
- for --params, every row equals the bytes computed by hand from the layout docs/cli.md states
  (padding of each unit's buffer to a multiple of W included);
- for a built-in workload, the fp32 rows match what each strategy reports itself
  (Accelerator::memory_report() after training, hasten-example --json "memory_per_rank"):
  rank 0 to the byte, every other rank at most the optimizer state of its padding below
  (the padding is rank W-1's) and never above;
- bad values are one error line."""
import json
import os

import harness as h

EXAMPLE = os.path.join(h.BIN, "hasten-example")
FIELDS = ("params", "param_shards", "grads", "optimizer")


def estimate(*args):
    p = h.run(h.hasten("estimate-memory", *args, "--json"), check=True)
    out = json.loads(p.stdout)
    return out, {(r["strategy"], r["dtype"]): r for r in out["rows"]}


# 1. Hand-computed: 7 parameters on 2 ranks: one unit padded to 8, a shard of 4 per rank.
out, rows = estimate("--params", "7", "--num_processes", "2")
want = {
    # strategy, dtype: params, param_shards, grads, optimizer
    ("ddp", "fp32"): (7 * 4, 0, 7 * 4, 7 * 8),
    ("ddp", "bf16"): (7 * 2, 7 * 4, 7 * 2, 7 * 8),
    ("zero1", "fp32"): (8 * 4, 4 * 4, 8 * 4, 4 * 8),
    ("zero1", "fp16"): (8 * 2, 4 * 4, 8 * 2, 4 * 8),
    ("zero2", "fp32"): (8 * 4, 4 * 4, 4 * 4, 4 * 8),
    ("zero2", "bf16"): (8 * 2, 4 * 4, 4 * 4, 4 * 8),
    ("zero3", "fp32"): (0, 4 * 4, 4 * 4, 4 * 8),
    ("fsdp", "bf16"): (0, 4 * 4, 4 * 4, 4 * 8),
}
if out["parameters"] != 7 or out["num_processes"] != 2 or len(out["rows"]) != 15:
    h.fail(f"unexpected header or row count: {out}")
for key, values in want.items():
    got = tuple(rows[key][f] for f in FIELDS)
    if got != values or rows[key]["total"] != sum(values):
        h.fail(f"{key}: estimate {got} (total {rows[key]['total']}), computed by hand {values}")
# 7e9 parameters on 8 ranks, as Accelerate's users size a 7B model: 16 bytes per parameter for
# ddp in fp32, 16/8 for zero3 (fp32 shard, its gradient, two moments).
_, big = estimate("--params", "7e9", "--num_processes", "8")
if big[("ddp", "fp32")]["total"] != 16 * 7 * 10**9 or big[("zero3", "fp32")]["total"] != 2 * 7 * 10**9:
    h.fail(f"7e9 on 8 ranks: ddp {big[('ddp', 'fp32')]['total']}, zero3 {big[('zero3', 'fp32')]['total']}")
if big[("zero2", "bf16")]["params"] != 2 * 7 * 10**9:
    h.fail(f"7e9 zero2 bf16 params: {big[('zero2', 'bf16')]['params']}")
_, same = estimate("--params", "7B", "--num_processes", "8")
if same != big:
    h.fail("--params 7B and --params 7e9 differ")
text = h.run(h.hasten("estimate-memory", "--params", "7e9", "--num_processes", "8"), check=True).stdout
if "zero3" not in text or "Assumptions" not in text or "13.04 GiB" not in text:  # zero3 fp32 total: 14e9 B
    h.fail("the table misses rows, the assumptions or the zero3 total:\n" + text)
print("ok: hand-computed rows for 7 and 7e9 parameters")

# 2. Against the strategies' own reports after training mlp-small (a unit per Linear).
for world, strategies in ((2, ("ddp", "zero1", "zero2", "zero3", "fsdp")), (3, ("zero2",))):
    est_out, est = estimate("--workload", "mlp-small", "--units", "--num_processes", str(world))
    pad_elems = sum((-u) % world for u in est_out["units"])
    for strategy in strategies:
        p = h.run(h.hasten("launch", "--num_processes", str(world), "--strategy", strategy, EXAMPLE, "--workload",
                           "mlp-small", "--warmup", "0", "--steps", "2", "--units", "--json", "--quiet"),
                  check=True, timeout=300)
        line = [l for l in p.stdout.splitlines() if '"impl"' in l][0]
        reports = json.loads(line[line.index("{"):])["memory_per_rank"]
        row = est[(strategy, "fp32")]
        for rank, report in enumerate(reports):
            for f in FIELDS:
                diff = row[f] - report[f]
                allowed = 0 if rank == 0 or f != "optimizer" else 8 * pad_elems
                if diff < 0 or diff > allowed:
                    h.fail(f"mlp-small {strategy} on {world} ranks, rank {rank} {f}: estimate {row[f]}, "
                           f"reported {report[f]} (allowed: {allowed} bytes below)")
        print(f"ok: {strategy} on {world} ranks: estimate {row['total']} B = rank 0's report; "
              f"ranks {[r['at_rest'] for r in reports]}")

# 3. Bad values: one line each.
for args, expect in (
    (["--params", "-5"], "--params"),
    (["--params", "nan"], "--params"),
    (["--params", "inf"], "--params"),
    (["--params", "0"], "--params"),
    (["--params", "1e16"], "--params"),
    (["--params", "7X"], "--params"),
    (["--workload", "mlp-huge"], "mlp-huge"),
    (["--params", "7e9", "--num_processes", "0"], "num_processes"),
    (["--params", "7e9", "--num_processes", "nan"], "num_processes"),
    (["--params", "7e9", "--dtypes", "fp8"], "fp8"),
    ([], "--params"),
    (["--params", "7e9", "--workload", "mlp-small"], "exactly one"),
):
    p = h.run(h.hasten("estimate-memory", *args))
    h.check_clean_failure(p, " ".join(args) or "no arguments", expect)
print("ok: bad values are one line each")
print("estimate_memory: OK")
