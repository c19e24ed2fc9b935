"""`hasten plugins describe NAME`: what a plugin declares (distributed_type values, config
section, presets, options), a misspelt name as one clear error, and docs/config.md's option
tables equal to the plugins' own descriptions."""
import os

import harness as h

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "config.md")

p = h.run(h.hasten("plugins", "describe", "zero3"), check=True)
for want in ["strategy zero 1.0", "selected by distributed_type: DEEPSPEED", "config section: deepspeed_config",
             "preset zero3: ", "| `stage` | `deepspeed_config.zero_stage` | int | `2` | 0 to 3 |"]:
    if want not in p.stdout:
        h.fail(f"describe zero3 does not say {want!r}:\n{p.stdout}")
p = h.run(h.hasten("plugins", "describe", "shm"), check=True)
if "serves: cpu; ranks on one machine; priority 20" not in p.stdout:
    h.fail(f"describe shm does not say what it serves:\n{p.stdout}")
# A plugin whose option and preset structs are longer than this host's (built against a later
# minor): the host steps through its arrays by the struct_size they declare.
longer = os.path.abspath(os.path.join(h.BIN, "..", "tests", "plugins", "longer"))
p = h.run(h.hasten("plugins", "describe", "longer_elements"), env={"HASTEN_PLUGIN_PATH": longer}, check=True)
for want in ["preset longer_fast: the fast mode", "preset longer_exact: the exact mode", "`level`", "`mode`",
             "fast, exact"]:
    if want not in p.stdout:
        h.fail(f"describe of a plugin with longer elements does not say {want!r}:\n{p.stdout}")
print("ok: options and presets of a plugin with longer elements are read by their declared stride")
p = h.run(h.hasten("plugins", "describe", "single"), check=True)
if "selected by distributed_type: NO" not in p.stdout or "options: none" not in p.stdout:
    h.fail(f"describe single:\n{p.stdout}")
h.check_clean_failure(h.run(h.hasten("plugins", "describe", "zerro")), "describe of a misspelt name",
                      "did you mean 'zero'")

with open(DOCS) as f:
    docs = f.read()
for name in ["fsdp", "zero", "ddp", "fp16"]:
    table = h.run(h.hasten("plugins", "describe", name, "--markdown"), check=True).stdout
    rows = [line for line in table.splitlines() if line.startswith("| `") or line.startswith("| (none)")]
    if len(rows) < 3:
        h.fail(f"describe {name} --markdown printed {len(rows)} option rows:\n{table}")
    for row in rows:
        if row not in docs:
            h.fail(f"docs/config.md does not carry {name}'s description row (regenerate it with "
                   f"`hasten plugins describe {name} --markdown`):\n{row}")
print("plugins describe: OK")
