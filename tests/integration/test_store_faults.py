"""Rendezvous faults end within rendezvous_timeout_s plus a few seconds, with an error naming
what was waited for: a store port answered by something that never replies, a rank 0 that
never starts, a missing rank (and the progress line said while waiting), a store host killed
during rendezvous. rendezvous_timeout_s bounds them even under a long timeout_s."""
import os
import signal
import socket
import subprocess
import threading
import time

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-worker")
CRASH_TEXT = ("terminate called", "Aborted", "Segmentation fault", "core dumped")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rank_env(rank, world, port, rendezvous_timeout):
    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "HASTEN_RENDEZVOUS_TIMEOUT_S": str(rendezvous_timeout), "HASTEN_TIMEOUT_S": "1800"}


def start(rank, world, port, rendezvous_timeout, steps="1"):
    return subprocess.Popen([WORKER, "--steps", steps], env=rank_env(rank, world, port, rendezvous_timeout),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, what, limit):
    """Waits for proc; it must fail cleanly within `limit` seconds. Returns its stderr."""
    begin = time.monotonic()
    try:
        _, err = proc.communicate(timeout=limit + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        h.fail(f"{what}: still running after {limit + 30} s\n{err}")
    took = time.monotonic() - begin
    if proc.returncode == 0 or proc.returncode < 0 or proc.returncode >= 128:
        h.fail(f"{what}: exit status {proc.returncode}, expected a clean failure\n{err}")
    for bad in CRASH_TEXT:
        if bad in err:
            h.fail(f"{what}: output contains '{bad}'\n{err}")
    return err, took


# A store port answered by something that accepts and never replies.
silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(16)
held = []


def accept_forever():
    while True:
        try:
            conn, _ = silent.accept()
        except OSError:
            return
        held.append(conn)  # kept open, never answered


threading.Thread(target=accept_forever, daemon=True).start()
port = silent.getsockname()[1]
start_time = time.monotonic()
err, _ = finish(start(1, 2, port, 3), "a store that never answers", 8)
took = time.monotonic() - start_time
if took > 3 + 5:
    h.fail(f"a store that never answers held rank 1 for {took:.1f} s (rendezvous_timeout_s 3)\n{err}")
if "no answer" not in err or f"127.0.0.1:{port}" not in err:
    h.fail(f"the error does not say that the store at 127.0.0.1:{port} never answered:\n{err}")
print(f"ok: a silent store port ends rank 1 in {took:.1f} s: {[l for l in err.splitlines() if 'error' in l][-1]}")
silent.close()

# Rank 0 missing (nobody listens) and rank 1 missing (rank 0 alone), side by side: each says
# what it waits for every 10 s, and gives up at rendezvous_timeout_s, not timeout_s.
p_nobody = free_port()
p_alone = free_port()
t0 = time.monotonic()
waiting_for_0 = start(1, 2, p_nobody, 12)
waiting_for_1 = start(0, 2, p_alone, 12)
err0, took0 = finish(waiting_for_0, "rank 0 never starts", 12 + 5)
err1, took1 = finish(waiting_for_1, "rank 1 never joins", 12 + 5)
if time.monotonic() - t0 > 12 + 8:
    h.fail(f"the missing-rank waits took {time.monotonic() - t0:.1f} s (rendezvous_timeout_s 12)")
if f"waiting for rank 0's store at 127.0.0.1:{p_nobody}" not in err0 or "of 12)" not in err0:
    h.fail(f"rank 1 did not say it waits for rank 0's store:\n{err0}")
if "could not reach rank 0's store" not in err0:
    h.fail(f"rank 1 did not end with an error naming rank 0's store:\n{err0}")
# c10d's own line for every refused connection attempt is not shown: hasten's lines say it.
if "[c10d]" in err0:
    h.fail(f"c10d's connection retry lines reach the user:\n{err0}")
if f"waiting for rank 1 of 2 at 127.0.0.1:{p_alone} (10 s of 12)" not in err1:
    h.fail(f"rank 0 did not say it waits for rank 1:\n{err1}")
if "rank 1 of 2 never joined" not in err1:
    h.fail(f"rank 0 did not end with an error naming rank 1:\n{err1}")
print(f"ok: missing ranks are named while waiting and after rendezvous_timeout_s ({time.monotonic() - t0:.1f} s)")

# The store host (rank 0) killed while rank 1 waits in rendezvous for a third rank.
port = free_port()
host = start(0, 3, port, 60)
member = start(1, 3, port, 60)


def connected(pid, port):
    """Whether process pid has an established TCP connection to port (it joined the store)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # c10d may connect over IPv6
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "01" and int(cols[2].split(":")[1], 16) == port and cols[9] in inodes:
                    return True
    return False


deadline = time.monotonic() + 60
while not connected(member.pid, port) and time.monotonic() < deadline:
    time.sleep(0.1)
if not connected(member.pid, port):
    host.kill()
    member.kill()
    h.fail("rank 1 did not connect to rank 0's store within 60 s")
time.sleep(1)
host.send_signal(signal.SIGKILL)
host.communicate()
err, took = finish(member, "the store host killed during rendezvous", 10)
if took > 10:
    h.fail(f"rank 1 took {took:.1f} s to notice that the store host died")
if "lost rank 0's store" not in err:
    h.fail(f"rank 1's error does not name the lost store:\n{err}")
print(f"ok: a store host killed during rendezvous ends rank 1 in {took:.1f} s")
print("store faults: OK")
