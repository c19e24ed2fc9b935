"""Mutated copies of a real plugin library, as GNU ld and as lld lay it out (bytes flipped in the
ELF header, the program headers and the dynamic section, files cut short at random points)
through `hasten plugins inspect`:
each file ends in the valid line or one clear error line naming it, and no run dies of a signal.
`make fuzz` runs it longer: HASTEN_TEST_FUZZ_SEED and HASTEN_TEST_FUZZ_SECONDS (then it keeps
making batches until the time is spent); a failure names the seed and the file."""
import os
import random
import struct
import tempfile
import time

import harness as h

seed = int(os.environ.get("HASTEN_TEST_FUZZ_SEED", "11"))
budget_s = float(os.environ.get("HASTEN_TEST_FUZZ_SECONDS", "0"))
rng = random.Random(seed)
plugin_dir = os.path.join(os.path.dirname(h.BIN), "lib", "hasten", "plugins")
# The csv tracker as the build links plugins (GNU ld), and, where the build has lld, linked by
# lld (tests/plugins/fuzz_lld): the two place tables differently. Batches alternate.
sources = [os.path.join(plugin_dir, "libhasten-tracker-csv.so")]
lld_copy = os.path.join(os.path.dirname(h.BIN), "tests", "plugins", "fuzz_lld", "libhasten-tracker-csv.so")
if os.path.exists(lld_copy):
    sources.append(lld_copy)


def layout(source):
    data = open(source, "rb").read()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phnum, = struct.unpack_from("<H", data, 0x38)
    dynamic = None
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + 56 * i)
        if p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_offset + p_filesz)
    if dynamic is None:
        h.fail(f"{source} has no PT_DYNAMIC")
    return data, {"ELF header": (0, 64), "program headers": (phoff, phoff + 56 * phnum), "dynamic section": dynamic}


layouts = [layout(source) for source in sources]


def mutant(data, regions):
    kind = rng.choice(["truncate", "ELF header", "program headers", "dynamic section"])
    if kind == "truncate":
        cut = rng.randrange(0, len(data))
        return f"cut at byte {cut}", data[:cut]
    lo, hi = regions[kind]
    b = bytearray(data)
    flips = []
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(lo, hi)
        b[at] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
        flips.append(at)
    return f"{kind}: bytes {flips} changed", bytes(b)


def check_batch(d, batch):
    paths = [os.path.join(d, name) for name, _ in batch]
    p = h.run(h.hasten("plugins", "inspect", *paths), timeout=300,
              env={"HASTEN_PLUGIN_PROBE_TIMEOUT_S": "10", "XDG_CACHE_HOME": d})
    if p.returncode not in (0, 1):
        # Which file? Each on its own names it.
        for (name, how), path in zip(batch, paths):
            q = h.run(h.hasten("plugins", "inspect", path), timeout=60, env={"XDG_CACHE_HOME": d})
            if q.returncode not in (0, 1):
                h.fail(f"seed {seed}: {name} ({how}) ended with status {q.returncode}\nstderr:\n{q.stderr}")
        h.fail(f"seed {seed}: a batch ended with status {p.returncode}\nstderr:\n{p.stderr[-3000:]}")
    for bad in ("terminate called", "Aborted", "Segmentation fault", "core dumped", "what():", "Bus error"):
        if bad in p.stderr:
            h.fail(f"seed {seed}: output contains '{bad}'\n{p.stderr[-3000:]}")
    valid = errors = 0
    for (name, how), path in zip(batch, paths):
        ok = [l for l in p.stdout.splitlines() if l == f"{path}: valid hasten plugin library (ABI 1)"]
        err = [l for l in p.stderr.splitlines() if l.startswith(f"hasten: error: {path} ")]
        if len(ok) + len(err) != 1 or (err and "is not a valid hasten plugin: " not in err[0]):
            h.fail(f"seed {seed}: {name} ({how}): expected the valid line or one error line, got {ok + err}")
        valid += len(ok)
        errors += len(err)
    if len(p.stderr.splitlines()) != errors:
        h.fail(f"seed {seed}: stderr has lines that are no file's verdict:\n{p.stderr[-3000:]}")
    return valid, errors


start = time.monotonic()
total = valid = 0
reasons = {}
with tempfile.TemporaryDirectory() as d:
    while True:
        source = sources[(total // 100) % len(sources)]
        batch = []
        for i in range(100):
            how, content = mutant(*layouts[(total // 100) % len(sources)])
            how = f"{how} in {os.path.relpath(source, os.path.dirname(h.BIN))}"
            name = f"libhasten-tracker-m{total + i}.so"
            with open(os.path.join(d, name), "wb") as f:
                f.write(content)
            batch.append((name, how))
        v, _ = check_batch(d, batch)
        valid += v
        total += len(batch)
        for name, _ in batch:
            os.remove(os.path.join(d, name))
        if total >= 200 * len(sources) and time.monotonic() - start >= budget_s:
            break
print(f"ok: seed {seed}: {total} mutated plugin files of {len(sources)} layouts, {valid} still valid, {total - valid} refused in one line "
      f"each, no signal")
