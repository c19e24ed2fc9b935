"""A tracker built against the frozen ABI 1.0 header loads in this host, trains, and receives
scalars in the 1.0 layout (names and values intact). Usage: test_v1_0.py PLUGIN_FILE"""
import math
import os
import subprocess
import sys
import tempfile

plugin = sys.argv[1]
bin_dir = os.environ["HASTEN_TEST_BIN_DIR"]
with tempfile.TemporaryDirectory() as d:
    p = subprocess.run([os.path.join(bin_dir, "hasten"), "plugins", "inspect", plugin], capture_output=True, text=True)
    if p.returncode != 0 or "1.0" not in p.stdout:
        sys.exit(f"FAIL: hasten plugins inspect refused the 1.0 tracker:\n{p.stdout}{p.stderr}")
    p = subprocess.run([os.path.join(bin_dir, "hasten-example"), "--workload", "mlp-small", "--steps", "4", "--warmup", "0",
                        "--log-every", "1", "--trackers", plugin, "--set", f"logging_dir={d}"],
                       capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        sys.exit(f"FAIL: training with the 1.0 tracker failed:\n{p.stdout}{p.stderr}")
    lines = open(os.path.join(d, "hasten-example", "v1_0_tracker.txt")).read().splitlines()
    losses = [float(l.split()[2]) for l in lines if l.split()[1:2] == ["loss"]]
    steps = [int(l.split()[0]) for l in lines if l.split()[1:2] == ["loss"]]
    if len(losses) != 4 or not all(math.isfinite(x) and 0 < x < 100 for x in losses) or steps != sorted(steps):
        sys.exit("FAIL: the 1.0 tracker did not receive 4 intact losses:\n" + "\n".join(lines))
    print(f"1.0 tracker: loaded, {len(lines)} records, losses {losses}")
