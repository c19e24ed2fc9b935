"""Every command-line error path: a non-zero exit, one clear error line, never an abort, a
segfault or 'terminate called'. And the happy paths next to them."""
import os
import tempfile

import harness as h

with tempfile.TemporaryDirectory() as d:
    env = {"HASTEN_HOME": os.path.join(d, "home")}
    bad_yaml = os.path.join(d, "bad.yaml")
    with open(bad_yaml, "w") as f:
        f.write("mixed_precision: bf16\nnum_processes: [1, 2\n")
    unknown_key = os.path.join(d, "unknown.yaml")
    with open(unknown_key, "w") as f:
        f.write("mixed_precison: bf16\n")
    marker = os.path.join(d, "a-worker-started")
    not_plugin = os.path.join(d, "libhasten-tracker-fake.so")
    with open(not_plugin, "w") as f:
        f.write("not a library\n")

    cases = [
        (h.hasten("frobnicate"), "unknown subcommand", "unknown command 'frobnicate'"),
        (h.hasten("env", "--config_file", os.path.join(d, "missing.yaml")), "env with a missing file", "does not exist"),
        (h.hasten("env", "--config_file", bad_yaml), "env with malformed YAML", "malformed YAML at line"),
        (h.hasten("env", "--config_file", unknown_key), "env with an unknown key", "did you mean 'mixed_precision'"),
        (h.hasten("plugins", "inspect", not_plugin), "inspect a text file", "not a loadable library"),
        (h.hasten("plugins", "inspect", os.path.join(d, "nothing.so")), "inspect a missing file", "no such file"),
        (h.hasten("plugins", "inspect", "/bin/true"), "inspect a program", "not a"),
        (h.hasten("config", "default", "--config_file", os.path.join(d, "x.yaml"), "--mixed_precision", "fp8"),
         "config default with a bad precision", "'fp8' is not allowed"),
        (h.hasten("launch"), "launch without a program", "no PROGRAM"),
        (h.hasten("launch", "--num_processes", "zero", "true"), "launch with a non-numeric count", "expected an integer"),
        (h.hasten("launch", "--config_file", os.path.join(d, "missing.yaml"), "true"), "launch with a missing file",
         "does not exist"),
        (h.hasten("launch", "--mixed_precision", "fp64", "true"), "launch with a bad precision", "'fp64' is not allowed"),
        (h.hasten("launch", "--num_process", "2", "true"), "launch with a misspelt flag",
         "unknown option '--num_process'; did you mean '--num_processes'?"),
        (h.hasten("launch", "--set", "mixed_precison=bf16", "true"), "launch --set with a misspelt key",
         "did you mean 'mixed_precision'"),
        (h.hasten("launch", "--set", "novalue", "true"), "launch --set without a value", "expected KEY=VALUE"),
        # Config errors that need the plugins: found by the launcher before any worker starts
        # (a started worker would leave the marker).
        (h.hasten("launch", "--num_processes", "2", "--strategy", "zro3", "sh", "-c", f"touch {marker}"),
         "launch with an unknown strategy", "did you mean 'zero3'"),
        (h.hasten("launch", "--num_processes", "2", "--strategy", "zero3", "--set", "strategy_options={stag: 3}",
                  "sh", "-c", f"touch {marker}"), "launch with a misspelt strategy option", "'stag'"),
        (h.hasten("launch", "--set", "mixed_precision=bf16", "--set", "precision_options={dtyp: bf16}",
                  "sh", "-c", f"touch {marker}"), "launch with a misspelt precision option", "'dtyp'"),
        (h.hasten("launch", "--set", "trackers=[csv]", "--set", "tracker_options={csvv: {}}",
                  "sh", "-c", f"touch {marker}"), "launch with tracker options for no tracker", "did you mean 'csv'"),
        (h.hasten("launch", "--num_processes", "2", "--set", "comm=glo", "sh", "-c", f"touch {marker}"),
         "launch with an unknown comm backend", "glo"),
        (h.example("--workload", "mlp-huge"), "example with an unknown workload", None),
        (h.example("--steps", "1", "--warmup", "0", "--mixed_precision", "fp16"), "fp16 on a CPU", "needs a CUDA device"),
        (h.example("--steps", "1", "--warmup", "0", "--strategy", "sngle"), "an unknown strategy", "did you mean 'single'"),
        (h.example("--steps", "1", "--warmup", "0", "--trace-out", os.path.join(d, "no-such-dir", "t")),
         "a --trace-out prefix in a missing directory", "--trace-out"),
        (h.example("--steps", "1", "--warmup", "0", "--strategy", not_plugin), "a strategy file that is not a library",
         "not a loadable library"),
        (h.example("--steps", "1", "--warmup", "0", "--set", "gradient_accumulation_steps=0"), "accumulation of 0",
         "out of range"),
    ]
    for cmd, what, expect in cases:
        h.check_clean_failure(h.run(cmd, env=env), what, expect)
    if os.path.exists(marker):
        h.fail("a worker started although the launcher's config check should have refused the run")

    # Environment typos are errors too.
    p = h.run(h.example("--steps", "1", "--warmup", "0"), env={**env, "HASTEN_MIXED_PRECISON": "bf16"})
    h.check_clean_failure(p, "a misspelt environment variable", "did you mean 'HASTEN_MIXED_PRECISION'")

    # `config default` writes a file that env accepts, and refuses to overwrite it.
    target = os.path.join(d, "cfg", "default.yaml")
    h.run(h.hasten("config", "default", "--config_file", target, "--mixed_precision", "bf16"), env=env, check=True)
    p = h.run(h.hasten("env", "--config_file", target), env=env, check=True)
    if '"mixed_precision": "bf16"' not in p.stdout or "BLAS:" not in p.stdout:
        h.fail("hasten env does not show the written config or the BLAS:\n" + p.stdout)
    h.check_clean_failure(h.run(h.hasten("config", "default", "--config_file", target), env=env),
                          "config default over an existing file", "already exists")

    # launch returns the program's exit status and passes the environment contract.
    p = h.run(h.hasten("launch", "sh", "-c", "exit 3"), env=env)
    if p.returncode != 3:
        h.fail(f"launch returned {p.returncode} for a program that exited 3")
    p = h.run(h.hasten("launch", "--mixed_precision", "bf16", "sh", "-c",
                       'echo "$RANK $WORLD_SIZE $LOCAL_RANK $HASTEN_CONFIG_JSON"'), env=env, check=True)
    if not p.stdout.startswith("0 1 0 ") or '"mixed_precision":"bf16"' not in p.stdout:
        h.fail("launch did not pass RANK/WORLD_SIZE/LOCAL_RANK and the config:\n" + p.stdout)
    p = h.run(h.hasten("launch", "--dry-run", "--set", "deepspeed_config.zero_stage=3", "--set", "distributed_type=DEEPSPEED",
                       "prog"), env=env, check=True)
    if '"strategy": "zero"' not in p.stdout or '"stage": 3' not in p.stdout:
        h.fail("launch --set did not reach the resolved config:\n" + p.stdout)
    p = h.run(h.hasten("plugins"), env=env, check=True)
    if "serves: cpu; ranks on one machine; priority 20" not in p.stdout or "serves: cpu; ranks on any machines; priority 10" not in p.stdout:
        h.fail("hasten plugins does not show what shm and gloo serve:\n" + p.stdout)
    p = h.run(h.hasten("launch", "--dry-run", "--num_processes", "2", "prog", "--flag"), env=env, check=True)
    if "worker rank 1 (local rank 1)" not in p.stdout or "prog --flag" not in p.stdout:
        h.fail("launch --dry-run did not print the plan:\n" + p.stdout)
    # The plan resolves the config as the workers will (they see WORLD_SIZE 2: data-parallel).
    if '"strategy": "ddp"' not in p.stdout:
        h.fail("launch --dry-run --num_processes 2 does not show the workers' strategy (ddp):\n" + p.stdout)
    # Thread variables the user set are kept, each on its own; the flag sets both.
    import subprocess
    only_blas = {k: v for k, v in {**os.environ, **env}.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    only_blas["OPENBLAS_NUM_THREADS"] = "3"
    p = subprocess.run(h.hasten("launch", "--dry-run", "prog"), env=only_blas, capture_output=True, text=True, timeout=60)
    if "OPENBLAS_NUM_THREADS=" in p.stdout or "OMP_NUM_THREADS=" not in p.stdout:
        h.fail("launch overwrote the user's OPENBLAS_NUM_THREADS (or set no OMP_NUM_THREADS):\n" + p.stdout)
    p = subprocess.run(h.hasten("launch", "--dry-run", "--num_cpu_threads_per_process", "2", "prog"), env=only_blas,
                       capture_output=True, text=True, timeout=60)
    if "OPENBLAS_NUM_THREADS=2" not in p.stdout or "OMP_NUM_THREADS=2" not in p.stdout:
        h.fail("launch --num_cpu_threads_per_process 2 did not set both thread variables:\n" + p.stdout)
    print("ok: the user's OPENBLAS_NUM_THREADS is kept; --num_cpu_threads_per_process sets both")
    # A program started under launch trains with the launched config.
    p = h.run(h.hasten("launch", "--mixed_precision", "bf16", os.path.join(h.BIN, "hasten-example"), "--steps", "2",
                       "--warmup", "0", "--json"), env=env, check=True)
    if '"mode":"bf16"' not in p.stdout:
        h.fail("the launched program did not see mixed_precision bf16:\n" + p.stdout)
    h.check_clean_failure(h.run(h.hasten("launch", os.path.join(d, "no-such-program")), env=env),
                          "launch of a missing program", "cannot run")
print("cli errors: OK")
