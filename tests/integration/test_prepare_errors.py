"""Misuses of prepare() and hasten::DataLoader with LibTorch's data API fail to compile with one
error that says what to do, printed first (not hundreds of lines of template instantiation):
prepare_errors.cpp, compiled with the project's own command for it (compile_commands.json),
once per HASTEN_CASE; without a case it must compile, so the flags are not the failure."""
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from compile_command import command_for

HERE = os.path.dirname(os.path.abspath(__file__))
SNIPPET = os.path.join(HERE, "prepare_errors.cpp")

WRAP = "wrap the dataset in hasten::DataLoader(dataset, {.batch_size = ...}): "
MAP_STYLE = "hasten::DataLoader takes map-style datasets only"
CASES = {
    1: WRAP + "prepare() does not take LibTorch data loaders (torch::data::make_data_loader)",
    2: WRAP + "prepare() does not take LibTorch data loaders (torch::data::make_data_loader)",
    3: WRAP + "prepare() takes data loaders, not datasets",
    4: MAP_STYLE,
    5: MAP_STYLE,
    6: "hasten::DataLoader takes a dataset, not a LibTorch data loader",
}


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def compile_case(args, directory, out_dir, case):
    args = list(args)
    i = args.index("-o")
    args[i + 1] = os.path.join(out_dir, f"case{case}.o")
    if case is not None:
        args.insert(1, f"-DHASTEN_CASE={case}")
    # English messages, whatever the machine's locale.
    env = dict(os.environ, LC_ALL="C", LANG="C")
    p = subprocess.run(args, cwd=directory, capture_output=True, text=True, timeout=600, env=env)
    return p.returncode, p.stdout + p.stderr


args, directory = command_for(SNIPPET)
with tempfile.TemporaryDirectory() as out_dir:
    cases = [None, *CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: compile_case(args, directory, out_dir, c), cases))
    for case, (rc, output) in zip(cases, results):
        if case is None:
            if rc != 0:
                fail(f"the correct program does not compile:\n{output}")
            continue
        errors = [line for line in output.splitlines() if "error:" in line]
        if rc == 0 or not errors:
            fail(f"case {case} compiled; it must not")
        if CASES[case] not in errors[0]:
            fail(f"case {case}: the first error is not the message\n  want: {CASES[case]}\n  got:  {errors[0]}\n{output}")
        if len(errors) != 1:
            fail(f"case {case}: {len(errors)} errors, want only the message:\n" + "\n".join(errors))
        print(f"case {case}: {errors[0].split('error:', 1)[1].strip()[:100]}...")
print("OK")
