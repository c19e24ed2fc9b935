"""A tracker built against a frozen ABI header (1.0 by default; tests/abi/frozen/1.N for the
later minors) loads in this host as that minor, trains, and receives scalars in that minor's
layout (names and values intact). Usage: test_v1_0.py PLUGIN_FILE [MINOR_VERSION]"""
import math
import os
import subprocess
import sys
import tempfile

plugin = sys.argv[1]
abi = sys.argv[2] if len(sys.argv) > 2 else "1.0"
bin_dir = os.environ["HASTEN_TEST_BIN_DIR"]
with tempfile.TemporaryDirectory() as d:
    p = subprocess.run([os.path.join(bin_dir, "hasten"), "plugins", "inspect", plugin], capture_output=True, text=True)
    row = [l.split() for l in p.stdout.splitlines() if l.startswith("tracker ")]
    if p.returncode != 0 or not row or row[0][3] != abi:
        sys.exit(f"FAIL: hasten plugins inspect refused the {abi} tracker or read another ABI:\n{p.stdout}{p.stderr}")
    p = subprocess.run([os.path.join(bin_dir, "hasten-example"), "--workload", "mlp-small", "--steps", "4", "--warmup", "0",
                        "--log-every", "1", "--trackers", plugin, "--set", f"logging_dir={d}"],
                       capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        sys.exit(f"FAIL: training with the {abi} tracker failed:\n{p.stdout}{p.stderr}")
    lines = open(os.path.join(d, "hasten-example", "v1_0_tracker.txt")).read().splitlines()
    losses = [float(l.split()[2]) for l in lines if l.split()[1:2] == ["loss"]]
    steps = [int(l.split()[0]) for l in lines if l.split()[1:2] == ["loss"]]
    if len(losses) != 4 or not all(math.isfinite(x) and 0 < x < 100 for x in losses) or steps != sorted(steps):
        sys.exit(f"FAIL: the {abi} tracker did not receive 4 intact losses:\n" + "\n".join(lines))
    print(f"{abi} tracker: loaded, {len(lines)} records, losses {losses}")
