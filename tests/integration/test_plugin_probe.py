"""Damaged and hostile plugin files (issue 11, item 3): a truncated library, a corrupted ELF
header, a read-only-after-relocation range or a constructor array reaching past the library, a
constructor that aborts, an entry function that segfaults or never returns, a garbage
descriptor. Each is probed in a child process: a program that does not select it runs and warns
in one line, selecting it is one error line, `hasten plugins inspect` gives one line and no
signal. The probe cache spares later starts the probe until the file changes."""
import json
import os
import shutil
import tempfile

import harness as h

build = os.path.dirname(h.BIN)
unsafe_dir = os.path.join(build, "tests", "plugins", "unsafe")
valid_lib = os.path.join(build, "tests", "plugins", "valid", "libhasten-tracker-valid_tracker.so")
quick = ("--steps", "1", "--warmup", "0")
SIGNAL_TEXT = ("terminate called", "Aborted", "Segmentation fault", "core dumped", "what():", "Bus error")


def no_signal(p, what):
    if p.returncode < 0 or p.returncode >= 128:
        h.fail(f"{what}: died with status {p.returncode}\nstderr:\n{p.stderr}")
    for bad in SIGNAL_TEXT:
        if bad in p.stderr or bad in p.stdout:
            h.fail(f"{what}: output contains '{bad}'\nstderr:\n{p.stderr}")


with tempfile.TemporaryDirectory() as tmp:
    plugins = os.path.join(tmp, "plugins")
    hang = os.path.join(tmp, "hang")  # the file that costs the time limit at every probe, apart
    os.makedirs(plugins)
    os.makedirs(hang)
    cache_home = os.path.join(tmp, "cache")
    env = {"XDG_CACHE_HOME": cache_home, "HASTEN_PLUGIN_PATH": plugins, "HASTEN_LOG_LEVEL": "info"}
    # With the hanging file: a short time limit (the first-party plugins' verdicts are cached
    # by then, so only the hanging file is probed under it).
    env_hang = {**env, "HASTEN_PLUGIN_PATH": plugins + ":" + hang, "HASTEN_PLUGIN_PROBE_TIMEOUT_S": "1"}

    def where(stem):
        return os.path.join(hang if stem == "hanging_entry" else plugins, f"libhasten-strategy-{stem}.so")

    # The damaged copies of a valid library.
    data = open(valid_lib, "rb").read()
    truncated = os.path.join(plugins, "libhasten-strategy-truncated.so")
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    corrupted = os.path.join(plugins, "libhasten-strategy-corrupted.so")
    bad_header = bytearray(data)
    bad_header[0x20:0x28] = (0x7FFFFFF0).to_bytes(8, "little")  # e_phoff far past the end
    with open(corrupted, "wb") as f:
        f.write(bad_header)
    # A read-only-after-relocation range (PT_GNU_RELRO) that reaches past the library: the
    # loader would make other memory of the process read-only (found by the fuzz pass).
    relro = os.path.join(plugins, "libhasten-strategy-relro.so")
    bad_relro = bytearray(data)
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    relro_headers = [i for i in range(phnum)
                     if int.from_bytes(data[phoff + 56 * i:phoff + 56 * i + 4], "little") == 0x6474E552]
    if len(relro_headers) != 1:
        h.fail(f"{valid_lib}: expected one PT_GNU_RELRO program header, found {len(relro_headers)}")
    memsz_at = phoff + 56 * relro_headers[0] + 40
    memsz = int.from_bytes(data[memsz_at:memsz_at + 8], "little")
    bad_relro[memsz_at:memsz_at + 8] = (memsz + (1 << 60)).to_bytes(8, "little")
    with open(relro, "wb") as f:
        f.write(bad_relro)
    # A constructor array that reaches past the library: the loader would call whatever follows.
    init_array = os.path.join(plugins, "libhasten-strategy-init_array.so")
    bad_init = bytearray(data)
    dynamic = [int.from_bytes(data[phoff + 56 * i + 8:phoff + 56 * i + 16], "little") for i in range(phnum)
               if int.from_bytes(data[phoff + 56 * i:phoff + 56 * i + 4], "little") == 2]  # PT_DYNAMIC's offset
    sizes = [dynamic[0] + 16 * k for k in range(512)
             if int.from_bytes(data[dynamic[0] + 16 * k:dynamic[0] + 16 * k + 8], "little") == 27]  # DT_INIT_ARRAYSZ
    if len(sizes) != 1:
        h.fail(f"{valid_lib}: expected one DT_INIT_ARRAYSZ, found {len(sizes)}")
    bad_init[sizes[0] + 8:sizes[0] + 16] = (1 << 40).to_bytes(8, "little")
    with open(init_array, "wb") as f:
        f.write(bad_init)
    for name in ("crash_constructor", "crash_entry", "hanging_entry", "garbage_descriptor"):
        shutil.copy(os.path.join(unsafe_dir, f"libhasten-strategy-{name}.so"), os.path.dirname(where(name)))

    expected = {  # file stem -> what its line must say
        "truncated": "not a loadable library: truncated: ",
        "corrupted": "not a loadable library: corrupted ELF header: program headers start at byte",
        "relro": f"not a loadable library: corrupted ELF header: program header {relro_headers[0]} (the range made "
                 "read-only after relocation) reaches outside the loadable segments (it covers",
        "init_array": "not a loadable library: corrupted dynamic section: DT_INIT_ARRAY (the constructors) covers "
                      "1099511627776 bytes from address",
        "crash_constructor": "aborted with signal 6 (SIGABRT) while being loaded",
        "crash_entry": "crashed with signal 11 (SIGSEGV) while running its entry function",
        "hanging_entry": "timed out after 1 s while running its entry function",
        "garbage_descriptor": "crashed with signal 11 (SIGSEGV) while its descriptors were read",
    }

    # `hasten plugins` lists each bad file once (and fills the cache for the first-party plugins
    # under the default time limit).
    p = h.run(h.hasten("plugins"), env=env)
    no_signal(p, "hasten plugins")
    if p.returncode != 0:
        h.fail(f"hasten plugins exited {p.returncode}:\n{p.stderr}")
    for stem, says in expected.items():
        lines = [l for l in p.stdout.splitlines() if f"libhasten-strategy-{stem}.so" in l]
        if len(lines) != (0 if stem == "hanging_entry" else 1) or (lines and says not in lines[0]):
            h.fail(f"hasten plugins: {stem}: expected one line saying '{says}', got {lines}")
    print("ok: hasten plugins lists each bad file once")

    # A program that selects none of them runs, and warns once per file, in one line each.
    p = h.run(h.example(*quick), env=env_hang)
    no_signal(p, "a program with every bad file on its path")
    if p.returncode != 0:
        h.fail(f"a program that selects no bad plugin failed ({p.returncode}):\n{p.stderr}")
    for stem, says in expected.items():
        lines = [l for l in p.stderr.splitlines() if f"libhasten-strategy-{stem}.so" in l]
        if len(lines) != 1 or "warning" not in lines[0] or "skipped: " not in lines[0] or says not in lines[0]:
            h.fail(f"{stem}: expected one warning line saying '{says}', got {lines}\nstderr:\n{p.stderr}")
        print(f"ok: not selected, one warning: {lines[0]}")

    # Selecting one is one error line that names the file and says what went wrong.
    for stem, says in expected.items():
        e = env_hang if stem == "hanging_entry" else env
        p = h.run(h.example(*quick), env={**e, "HASTEN_STRATEGY": stem})
        h.check_clean_failure(p, f"selecting strategy {stem}", expect=f"libhasten-strategy-{stem}.so was refused: {says}")
    for stem in ("truncated", "crash_entry"):
        p = h.run(h.example(*quick), env={**env, "HASTEN_STRATEGY": where(stem)})
        h.check_clean_failure(p, f"selecting strategy {stem} by path", expect=expected[stem])

    # `hasten plugins inspect FILE`: one line, exit 1, no signal; with several files, one line each.
    p = h.run(h.hasten("plugins", "inspect", where("garbage_descriptor")), env=env)
    h.check_clean_failure(p, "inspect garbage_descriptor", expect=expected["garbage_descriptor"])
    p = h.run(h.hasten("plugins", "inspect", *[where(stem) for stem in expected]), env=env_hang)
    no_signal(p, "inspect every bad file")
    if p.returncode != 1 or p.stdout.strip():
        h.fail(f"inspect of bad files: exit {p.returncode}, stdout {p.stdout!r}")
    for stem, says in expected.items():
        lines = [l for l in p.stderr.splitlines() if where(stem) in l]
        if len(lines) != 1 or not lines[0].startswith("hasten: error: ") or says not in lines[0]:
            h.fail(f"inspect {stem}: expected one error line saying '{says}', got {lines}")
    if len(p.stderr.splitlines()) != len(expected):
        h.fail(f"inspect of bad files printed more than one line each:\n{p.stderr}")
    print("ok: inspect gives one line per bad file, exit 1")

    # The cache: the runs above remembered every verdict but the timeout's; another start
    # probes only the hanging file, and touching a file probes it again.
    cache_file = os.path.join(cache_home, "hasten", "plugin-probes.json")
    entries = {e["file"]: e for e in json.load(open(cache_file))["entries"]}
    for stem in ("crash_constructor", "crash_entry", "garbage_descriptor"):
        e = entries.get(os.path.join(os.path.realpath(plugins), f"libhasten-strategy-{stem}.so"))
        if e is None or e["safe"] or expected[stem] not in e["reason"]:
            h.fail(f"the cache does not remember {stem} as unsafe: {e}")

    def probed(extra_env=None):
        p = h.run(h.hasten("plugins"), env={**env_hang, "HASTEN_LOG_LEVEL": "debug", **(extra_env or {})})
        if p.returncode != 0:
            h.fail(f"hasten plugins exited {p.returncode}:\n{p.stderr}")
        return sorted(os.path.basename(l.split("probing plugin file ")[1].split()[0])
                      for l in p.stderr.splitlines() if "probing plugin file " in l)

    again = probed()
    if again != ["libhasten-strategy-hanging_entry.so"]:
        h.fail(f"a second start probed {again}, expected only the timed-out file")
    print("ok: a second start probes only what timed out")
    os.utime(os.path.join(plugins, "libhasten-strategy-crash_entry.so"))
    again = probed()
    if again != ["libhasten-strategy-crash_entry.so", "libhasten-strategy-hanging_entry.so"]:
        h.fail(f"after touching crash_entry a start probed {again}")
    print("ok: touching a file probes it again")

    # A corrupt cache is ignored and rewritten; an unwritable one is no error.
    with open(cache_file, "w") as f:
        f.write("{not json")
    again = probed()
    if "libhasten-strategy-crash_entry.so" not in again:
        h.fail(f"with a corrupt cache a start probed only {again}")
    json.load(open(cache_file))
    print("ok: a corrupt cache is rewritten")
    blocked = os.path.join(tmp, "blocked")
    with open(blocked, "w") as f:
        f.write("a file where the cache directory would be\n")
    p = h.run(h.hasten("plugins"), env={**env, "XDG_CACHE_HOME": blocked, "HASTEN_PLUGIN_PROBE_TIMEOUT_S": "30"})
    if p.returncode != 0:
        h.fail(f"an unwritable cache made a run fail:\n{p.stderr}")
    print("ok: an unwritable cache is not an error")

    # A bad time limit is one error line naming the variable.
    p = h.run(h.hasten("plugins"), env={**env, "HASTEN_PLUGIN_PROBE_TIMEOUT_S": "soon"})
    h.check_clean_failure(p, "HASTEN_PLUGIN_PROBE_TIMEOUT_S=soon", expect="HASTEN_PLUGIN_PROBE_TIMEOUT_S='soon'")

    # Real libraries of other linkers and layouts pass the ELF check (no false "corrupted"):
    # glibc's (packed RELR relocations), libstdc++, LibTorch's wheel (rewritten by auditwheel)
    # and the lld-linked copy of the csv tracker: each is a library that is no hasten plugin.
    import glob
    import sysconfig
    real = [p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6") if os.path.exists(p)]
    real += glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "torch", "lib", "libc10.so"))
    lld_copy = os.path.join(build, "tests", "plugins", "fuzz_lld", "libhasten-tracker-csv.so")
    p = h.run(h.hasten("plugins", "inspect", *real, *([lld_copy] if os.path.exists(lld_copy) else [])), env=env)
    no_signal(p, "inspect of real libraries")
    for lib in real:
        lines = [l for l in p.stderr.splitlines() if lib in l]
        if len(lines) != 1 or "missing entry symbol" not in lines[0]:
            h.fail(f"{lib}: expected one 'missing entry symbol' line, got {lines}")
    if os.path.exists(lld_copy) and f"{lld_copy}: valid hasten plugin library" not in p.stdout:
        h.fail(f"the lld-linked csv tracker was refused:\n{p.stderr}")
    print(f"ok: {len(real)} real libraries and the lld copy pass the ELF check")
