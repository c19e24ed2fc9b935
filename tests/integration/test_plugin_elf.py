"""C-tier plugins (trackers, comm backends) link neither LibTorch nor hasten."""
import glob
import os
import subprocess

import harness as h

plugin_dir = os.path.join(os.path.dirname(h.BIN), "lib", "hasten", "plugins")
c_tier = sorted(glob.glob(os.path.join(plugin_dir, "libhasten-tracker-*.so")) +
                glob.glob(os.path.join(plugin_dir, "libhasten-comm-*.so")))
if len(c_tier) < 2:
    h.fail(f"expected the csv and jsonl trackers in {plugin_dir}, found {c_tier}")
for lib in c_tier:
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    needed = [l.split("[")[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]
    bad = [n for n in needed if n.startswith(("libtorch", "libc10", "libhasten", "libcaffe2"))]
    if bad:
        h.fail(f"{os.path.basename(lib)} links {bad}")
    exports = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    symbols = [l.split()[-1] for l in exports.splitlines() if " T " in l]
    if symbols != ["hasten_plugin_entry_v1"]:
        h.fail(f"{os.path.basename(lib)} exports {symbols}, expected only hasten_plugin_entry_v1")
    print(f"ok: {os.path.basename(lib)} needs {needed}")
