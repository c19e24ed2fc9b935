"""The shm comm plugin reclaims /dev/shm segments whose creating process is dead (a worker
killed during set-up leaves its segment behind), keeps those of live processes, of another PID
namespace (a container sharing /dev/shm, where the pid means another process) and of another
user, and leaves no segment of its own behind after a run, failed or not."""
import os
import socket
import subprocess
import uuid

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-worker")
SHM = "/dev/shm"


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # reaped: no process has this pid now (until reuse, far away)


def ours():
    return {n for n in os.listdir(SHM) if n.startswith("hasten-shm-")}


def leaked(names):
    """Those whose creator has exited: a live creator's segment belongs to a run still going
    (another test of a parallel ctest), not to one that left it behind."""
    out = set()
    for n in names:
        try:
            os.kill(int(n.split("-")[3]), 0)
        except (ProcessLookupError, ValueError, IndexError):
            out.add(n)
        except PermissionError:
            pass
    return out


tag = uuid.uuid4().hex[:16]
ns = os.stat("/proc/self/ns/pid").st_ino
gone = dead_pid()
orphan = f"hasten-shm-{ns}-{gone}-{tag}-1"
alive = f"hasten-shm-{ns}-{os.getpid()}-{tag}-0"
elsewhere = f"hasten-shm-{ns + 1}-{gone}-{tag}-2"  # the same pid in another namespace
theirs = f"hasten-shm-{ns}-{gone}-{tag}-3"  # another user's
kept = [alive, elsewhere] + ([theirs] if os.geteuid() == 0 else [])
for name in [orphan] + kept:
    with open(os.path.join(SHM, name), "wb") as f:
        f.write(b"\0" * 4096)
    os.chmod(os.path.join(SHM, name), 0o600)
if os.geteuid() == 0:
    os.chown(os.path.join(SHM, theirs), 65534, 65534)
before = ours() - {orphan} - set(kept)
try:
    env = {"HASTEN_COMM": "shm", "HASTEN_HOME": os.path.join(os.getcwd(), "shm-reclaim-home")}
    p = h.run(h.hasten("launch", "--num_processes", "2", WORKER, "--steps", "3"), env=env, timeout=120)
    if p.returncode != 0:
        h.fail(f"an shm run failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
    if os.path.exists(os.path.join(SHM, orphan)):
        h.fail(f"/dev/shm/{orphan}, whose creator is dead, was not reclaimed by the next run")
    for name in kept:
        if not os.path.exists(os.path.join(SHM, name)):
            h.fail(f"/dev/shm/{name} (a live creator's, another namespace's or another user's) was removed")
    print(f"ok: a dead creator's segment is reclaimed; kept: a live one's, another PID namespace's"
          f"{', another user' + chr(39) + 's' if theirs in kept else ''}")
    left = leaked(ours() - before - set(kept))
    if left:
        h.fail(f"the run left segments behind: {sorted(left)}")
    print("ok: a clean run leaves no segment")

    # Set-up that fails after the segments exist (the ranks disagree on buffer_mb) leaves none.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    procs = []
    for rank, mb in ((0, 1), (1, 2)):
        e = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
             "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "HASTEN_COMM_OPTIONS": "{buffer_mb: %d}" % mb, "HASTEN_RENDEZVOUS_TIMEOUT_S": "20"}
        procs.append(subprocess.Popen([WORKER, "--steps", "1"], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    errs = [pr.communicate(timeout=60)[1] for pr in procs]
    if any(pr.returncode == 0 for pr in procs) or not any("the same buffer_mb on every rank" in e for e in errs):
        h.fail("ranks with different buffer_mb did not fail in shm set-up:\n" + "\n".join(errs))
    left = leaked(ours() - before - set(kept))
    if left:
        h.fail(f"a failed set-up left segments behind: {sorted(left)}")
    print("ok: a failed set-up leaves no segment")
finally:
    for name in [orphan] + kept:
        try:
            os.unlink(os.path.join(SHM, name))
        except FileNotFoundError:
            pass
print("shm reclaim: OK")
