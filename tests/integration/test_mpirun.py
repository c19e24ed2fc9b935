"""mpirun without hasten launch: `mpirun -np 2 hasten-fashion-mnist` trains (OpenMPI's
environment gives the ranks; the store's port comes from the MPI job id), with the shm and with
the gloo comm plugin, and its losses are bitwise those of `hasten launch --num_processes 2` with
the same comm; `-x MASTER_ADDR -x MASTER_PORT` given explicitly works too. The mpi comm
plugin passes the collective suite of gloo and shm under mpirun -np 2 and 3 and the device mesh's
group check (MPI_Comm_split) under -np 4, trains ddp and zero3
to gloo's losses, and is refused in one line under hasten launch. Skips (exit 77)
without mpirun (Debian's openmpi-bin, which scripts/install-deps.sh installs) or without
Fashion-MNIST."""
import json
import os
import shutil
import socket
import sys
import tempfile

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
MPIRUN = shutil.which("mpirun")
if MPIRUN is None:
    print("SKIP: mpirun is not installed (apt-get install openmpi-bin)")
    sys.exit(77)
if not os.path.isfile(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print(f"SKIP: Fashion-MNIST is not installed in {DATA}")
    sys.exit(77)

PROGRAM = os.path.join(h.BIN, "hasten-fashion-mnist")
ARGS = ["--epochs", "1", "--max_steps", "40", "--batch_size", "32", "--eval_batch_size", "500", "--threads", "1",
        "--json", "--quiet"]
# Root in a container, and more processes than cores: OpenMPI refuses both unless told.
MPI = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def summary(p, what):
    if p.returncode != 0:
        h.fail(f"{what} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    for line in p.stdout.splitlines():
        line = line.removeprefix("[rank 0] ")
        if line.startswith("{"):
            return json.loads(line)
    h.fail(f"{what}: no JSON summary:\n{p.stdout}\n{p.stderr}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


for variable in ("MASTER_ADDR", "MASTER_PORT"):  # the job id's port is what is tested
    os.environ.pop(variable, None)

with tempfile.TemporaryDirectory() as d:
    for comm in ("shm", "gloo"):
        args = [*ARGS, "--set", f"comm={comm}"]
        launched = summary(h.run(h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", PROGRAM, *args,
                                          "--project_dir", os.path.join(d, "launch-" + comm))),
                           f"hasten launch, {comm}")
        by_mpi = summary(h.run([*MPI, PROGRAM, *args, "--project_dir", os.path.join(d, "mpi-" + comm)],
                               timeout=300), f"mpirun -np 2, {comm}")
        if by_mpi["num_processes"] != 2 or by_mpi["steps"] != 40:
            h.fail(f"mpirun -np 2 ({comm}) ran {by_mpi['num_processes']} processes, {by_mpi['steps']} steps")
        for key in ("test_loss", "test_accuracy", "eval_count"):
            if by_mpi[key] != launched[key]:
                h.fail(f"mpirun -np 2 ({comm}): {key} {by_mpi[key]!r}, hasten launch: {launched[key]!r}")
        print(f"ok: mpirun -np 2 with {comm}: test_loss {by_mpi['test_loss']} as under hasten launch")
    # The address and port given through mpirun's -x, as across machines.
    port = free_port()
    given = summary(h.run([*MPI, "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", PROGRAM, *ARGS, "--set",
                           "comm=gloo", "--project_dir", os.path.join(d, "given")], timeout=300),
                    "mpirun -x MASTER_ADDR -x MASTER_PORT")
    if given["test_loss"] != by_mpi["test_loss"]:
        h.fail(f"mpirun with -x MASTER_PORT={port}: test_loss {given['test_loss']}, without: {by_mpi['test_loss']}")
    print(f"ok: mpirun -x MASTER_ADDR -x MASTER_PORT={port}: the same losses")
    # The mpi comm plugin (plugins/comm/mpi): the collective suite gloo and shm pass, on 2 and
    # 3 processes, and training whose losses equal gloo's (2 ranks: a sum of two is the same
    # in any order).
    suite = os.environ.get("HASTEN_TEST_MPI_SUITE")
    if not suite:
        h.fail("the mpi comm plugin was not built (HASTEN_TEST_MPI_SUITE is unset): install libopenmpi-dev "
               "(scripts/install-deps.sh does)")
    for n in ("2", "3"):
        p = h.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", n, "-x", "HASTEN_COMM=mpi", suite, "--gtest_color=no",
                   "--gtest_filter=Mpi.EveryOperationAndDtypeUnderMpirun"], timeout=300)
        if p.returncode != 0 or "[  PASSED  ] 1 test" not in p.stdout:
            h.fail(f"the collective suite under mpirun -np {n} with comm mpi:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
        print(f"ok: mpi comm plugin: every operation and dtype on {n} processes")
    # Process groups (MPI_Comm_split): a dp_replicate 2 x dp_shard 2 mesh on 4 processes.
    p = h.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "4", "-x", "HASTEN_COMM=mpi", suite,
               "--gtest_color=no", "--gtest_filter=Mpi.DeviceMeshUnderMpirun"], timeout=300)
    if p.returncode != 0 or "[  PASSED  ] 1 test" not in p.stdout:
        h.fail(f"the device mesh under mpirun -np 4 with comm mpi:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    print("ok: mpi comm plugin: every group of a 2 x 2 mesh on 4 processes")
    for strategy in ("ddp", "zero3"):
        args = [*ARGS, "--strategy", strategy]
        gloo = summary(h.run([*MPI, PROGRAM, *args, "--set", "comm=gloo", "--project_dir",
                              os.path.join(d, "gloo-" + strategy)], timeout=300), f"{strategy} over gloo")
        mpi = summary(h.run([*MPI, PROGRAM, *args, "--set", "comm=mpi", "--project_dir",
                             os.path.join(d, "mpi-" + strategy)], timeout=300), f"{strategy} over mpi")
        if mpi["test_loss"] != gloo["test_loss"] or mpi["test_accuracy"] != gloo["test_accuracy"]:
            h.fail(f"{strategy} over mpi: test_loss {mpi['test_loss']}, over gloo {gloo['test_loss']}")
        print(f"ok: {strategy} over mpi: test_loss {mpi['test_loss']}, as over gloo")
    # Outside mpirun each process is a world of its own: refused in one line.
    p = h.run(h.hasten("launch", "--num_processes", "2", "--main_process_port", "0", PROGRAM, *ARGS, "--set",
                       "comm=mpi", "--project_dir", os.path.join(d, "outside")), timeout=300)
    line = next((l for l in p.stderr.splitlines() if "MPI sees this process as rank" in l), None)
    if p.returncode == 0 or line is None or "mpirun" not in line or any(
            bad in p.stderr for bad in ("terminate called", "Segmentation fault", "what():")):
        h.fail(f"comm mpi under hasten launch: status {p.returncode}\n{p.stderr}")
    print(f"ok: comm mpi under hasten launch: {line.strip()}")
print("mpirun: OK")
