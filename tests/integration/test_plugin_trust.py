"""Plugins are code: a plugin library anyone on the machine may replace is refused (a
world-writable file, or one in a world-writable directory that is not sticky), a sticky one
such as /tmp is fine; HASTEN_PLUGIN_PATH takes absolute directories only; with HOME unset the
default config file is never read from the working directory."""
import glob
import os
import shutil
import subprocess
import tempfile

import harness as h

CSV = glob.glob(os.path.join(h.BIN, "..", "lib", "hasten", "plugins", "libhasten-tracker-csv.so"))[0]


def inspect(path):
    return h.run(h.hasten("plugins", "inspect", path))


with tempfile.TemporaryDirectory() as d:
    os.chmod(d, 0o755)
    lib = os.path.join(d, "libhasten-tracker-copy.so")
    shutil.copy(CSV, lib)
    os.chmod(lib, 0o644)
    p = inspect(lib)
    if p.returncode != 0 or "valid hasten plugin library" not in p.stdout:
        h.fail(f"a copy of the csv plugin with safe permissions is not valid:\n{p.stdout}\n{p.stderr}")
    os.chmod(lib, 0o666)
    h.check_clean_failure(inspect(lib), "a world-writable plugin file", "world-writable (mode 0666)")
    p = h.run(h.hasten("plugins"), env={"HASTEN_PLUGIN_PATH": d})
    if "world-writable (mode 0666)" not in p.stdout + p.stderr:
        h.fail(f"hasten plugins does not list the world-writable file as refused:\n{p.stdout}\n{p.stderr}")
    os.chmod(lib, 0o644)
    os.chmod(d, 0o777)
    h.check_clean_failure(inspect(lib), "a plugin in a world-writable directory", "in the world-writable directory")
    # A link in a world-writable directory to a safe library elsewhere is as replaceable.
    safe = os.path.join(d, "safe")
    os.makedirs(safe, mode=0o755)
    shutil.move(lib, os.path.join(safe, "libhasten-tracker-copy.so"))
    os.chmod(d, 0o755)
    open_dir = os.path.join(d, "open")
    os.makedirs(open_dir)
    os.chmod(open_dir, 0o777)
    link = os.path.join(open_dir, "libhasten-tracker-linked.so")
    os.symlink(os.path.join(safe, "libhasten-tracker-copy.so"), link)
    h.check_clean_failure(inspect(link), "a link to a plugin, in a world-writable directory",
                          "in the world-writable directory")
    p = h.run(h.hasten("plugins"), env={"HASTEN_PLUGIN_PATH": open_dir})
    if "in the world-writable directory '" + open_dir not in p.stdout + p.stderr:
        h.fail(f"discovery loaded a link in a world-writable directory:\n{p.stdout}\n{p.stderr}")
    shutil.move(os.path.join(safe, "libhasten-tracker-copy.so"), lib)
    os.chmod(d, 0o777)
    os.chmod(d, 0o1777)  # sticky, as /tmp: only a file's owner may replace it
    p = inspect(lib)
    if p.returncode != 0:
        h.fail(f"a plugin in a sticky world-writable directory was refused:\n{p.stderr}")
    os.chmod(d, 0o755)
    print("ok: world-writable plugin files and non-sticky directories are refused, a sticky one is not")

h.check_clean_failure(h.run(h.hasten("plugins"), env={"HASTEN_PLUGIN_PATH": "plugins"}),
                      "a relative HASTEN_PLUGIN_PATH", "is a relative directory")

# HOME unset: a default_config.yaml under the working directory is not read.
with tempfile.TemporaryDirectory() as d:
    os.makedirs(os.path.join(d, ".config", "hasten"))
    with open(os.path.join(d, ".config", "hasten", "default_config.yaml"), "w") as f:
        f.write("num_processes: 3\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "HASTEN_HOME", "XDG_CONFIG_HOME")}
    p = subprocess.run(h.hasten("config", "show"), capture_output=True, text=True, cwd=d, env=env, timeout=60)
    if p.returncode != 0 or "num_processes\t1\tdefault" not in p.stdout:
        h.fail(f"with HOME unset, the working directory's .config/hasten/default_config.yaml was read:\n{p.stdout}\n{p.stderr}")
    print("ok: with HOME unset the working directory's default config is not read")
print("plugin trust: OK")
