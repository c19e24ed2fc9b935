"""Nobody in who does not belong: a one-machine run listens on loopback only; rank 0's store
and machine 0's launcher agent refuse a client without the run's token, with one line on
their side; a rank with another run's token fails fast naming the store's address; the token
is printed nowhere."""
import os
import socket
import struct
import subprocess
import time

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-worker")
HASTEN = h.hasten()[0]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def descendants(pid):
    """pid and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def listening(pid):
    """(address, port) of every TCP socket process pid listens on."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                addr_hex, port_hex = cols[1].split(":")
                raw = bytes.fromhex(addr_hex)
                if v6:
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    addr = socket.inet_ntop(socket.AF_INET6, words)
                else:
                    addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
                found.append((addr, int(port_hex, 16)))
    return found


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return {}


def frame(op, key, payload=b""):
    body = bytes([op]) + struct.pack("<I", len(key)) + key + payload
    return struct.pack("<I", len(body)) + body


def store_hello(port, token):
    """Opens hasten's store protocol with token; returns (status, message) of the answer,
    or None when the store closed without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(frame(1, b"hasten-store/1", token))
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        (n,) = struct.unpack("<I", head)
        body = b""
        while len(body) < n:
            chunk = s.recv(n - len(body))
            if not chunk:
                break
            body += chunk
        return body[0], body[1:].decode(errors="replace")


def closed_by_peer(sock):
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


# 1. A one-machine run: rank 1 arrives 8 s late, so rank 0's store waits, listening.
env = dict(os.environ)
env.pop("HASTEN_RUN_TOKEN", None)
launcher = subprocess.Popen([HASTEN, "launch", "--num_processes", "2", WORKER, "--steps", "2", "--late-rank", "1",
                             "--late-s", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
store_port, token, rank0 = None, None, None
deadline = time.monotonic() + 30
while time.monotonic() < deadline and store_port is None:
    for pid in descendants(launcher.pid):
        e = environ_of(pid)
        if e.get(b"RANK") == b"0" and listening(pid):
            rank0, token, store_port = pid, e.get(b"HASTEN_RUN_TOKEN"), int(e[b"MASTER_PORT"])
    time.sleep(0.1)
if store_port is None:
    launcher.kill()
    h.fail("rank 0 of a one-machine run never listened")
if not token or len(token) != 32:
    h.fail(f"the workers did not get a 32-digit run token: {token!r}")
sockets = [(pid, a) for pid in descendants(launcher.pid) for a in listening(pid)]
if not any(port == store_port for _, (_, port) in sockets):
    h.fail(f"nothing listens on the store's port {store_port}: {sockets}")
open_wide = [(pid, a) for pid, a in sockets if a[0] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
if open_wide:
    h.fail(f"a one-machine run listens beyond loopback: {open_wide} (all: {sockets})")
print(f"ok: a one-machine run listens on loopback only: {sorted(set(a for _, a in sockets))}")

# A client with another token, one with none, and one that does not speak the protocol.
wrong = store_hello(store_port, b"0123456789abcdef0123456789abcdef")
if wrong is None or wrong[0] != 1 or "not this run's" not in wrong[1]:
    h.fail(f"the store did not refuse another run's token: {wrong}")
none = store_hello(store_port, b"")
if none is None or none[0] != 1 or "none was presented" not in none[1]:
    h.fail(f"the store did not refuse a client without a token: {none}")
with socket.create_connection(("127.0.0.1", store_port), timeout=10) as s:
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    if not closed_by_peer(s):
        h.fail("the store kept a connection that sent HTTP open")
good = store_hello(store_port, token)
if good is None or good[0] != 0:
    h.fail(f"the store refused the run's own token: {good}")
out, err = launcher.communicate(timeout=120)
if launcher.returncode != 0:
    h.fail(f"the run failed after the refused clients (exit {launcher.returncode}):\n{out}\n{err}")
refusals = [l for l in err.splitlines() if "refused the connection from 127.0.0.1" in l]
if not any("another run's token" in l for l in refusals) or not any("no run token" in l for l in refusals):
    h.fail(f"rank 0 did not name the refused clients in one line each:\n{err}")
if token.decode() in out + err:
    h.fail("the run token was printed")
print(f"ok: the store refused 3 clients, the run finished: {refusals[0]}")

# 2. A rank with another run's token fails fast, naming the store; rank 0 names the refusal.
port = free_port()
base = {**os.environ, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "HASTEN_RENDEZVOUS_TIMEOUT_S": "6"}
r0 = subprocess.Popen([WORKER, "--steps", "1"], env={**base, "RANK": "0", "LOCAL_RANK": "0",
                                                     "HASTEN_RUN_TOKEN": "a" * 32},
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
time.sleep(0.5)
began = time.monotonic()
r1 = h.run([WORKER, "--steps", "1"], env={**base, "RANK": "1", "LOCAL_RANK": "1", "HASTEN_RUN_TOKEN": "b" * 32},
           timeout=60)
took = time.monotonic() - began
_, err0 = r0.communicate(timeout=60)
if r1.returncode == 0 or took > 4:
    h.fail(f"a rank with another run's token did not fail fast ({took:.1f} s, exit {r1.returncode}):\n{r1.stderr}")
if f"127.0.0.1:{port} refused this rank" not in r1.stderr or "not this run's" not in r1.stderr:
    h.fail(f"the error does not name the store and the token:\n{r1.stderr}")
if "another run's token" not in err0:
    h.fail(f"rank 0 did not say it refused a client:\n{err0}")
for secret in ("a" * 32, "b" * 32):
    if secret in r1.stderr + err0:
        h.fail("a run token was printed")
print(f"ok: another run's token fails in {took:.1f} s: {[l for l in r1.stderr.splitlines() if 'error' in l][-1]}")

# 3. Machine 0's launcher agent: its coordinator listens on main_process_ip, refuses JOINs
# without the token, closes a connection that floods a line, then runs with the real machine 1.
port = free_port()
token = "c" * 32
agent_env = {**os.environ, "HASTEN_RUN_TOKEN": token, "HASTEN_RENDEZVOUS_TIMEOUT_S": "60"}


def machine(rank):
    return subprocess.Popen([HASTEN, "launch", "--num_machines", "2", "--machine_rank", str(rank), "--num_processes",
                             "2", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
                             "--max_restarts", "1", WORKER, "--steps", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_env)


m0 = machine(0)
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not any(p == port + 1 for _, p in listening(m0.pid)):
    time.sleep(0.1)
agent_sockets = listening(m0.pid)
if not any(p == port + 1 for _, p in agent_sockets):
    m0.kill()
    h.fail(f"machine 0's launcher did not listen on {port + 1}: {agent_sockets}")
if any(a not in ("127.0.0.1", "::ffff:127.0.0.1") for a, _ in agent_sockets):
    h.fail(f"machine 0's launcher listens beyond main_process_ip 127.0.0.1: {agent_sockets}")
answers = []
for line in (b"JOIN 1 " + b"d" * 32 + b"\n", b"JOIN 1\n"):
    with socket.create_connection(("127.0.0.1", port + 1), timeout=10) as s:
        s.sendall(line)
        s.settimeout(10)
        answers.append(s.recv(4096).decode(errors="replace"))
if not all(a.startswith("EXIT 1 machine 0's launcher refused this machine") for a in answers):
    h.fail(f"machine 0's launcher did not refuse JOINs without the run's token: {answers}")
with socket.create_connection(("127.0.0.1", port + 1), timeout=10) as s:
    try:
        s.sendall(b"JOIN 1 " + b"x" * 100000)
    except OSError:
        pass
    if not closed_by_peer(s):
        h.fail("machine 0's launcher kept a connection that sent a 100 kB line")
m1 = machine(1)
out1, err1 = m1.communicate(timeout=120)
out0, err0 = m0.communicate(timeout=120)
if m0.returncode != 0 or m1.returncode != 0:
    h.fail(f"the run across machines failed after the refused JOINs ({m0.returncode}, {m1.returncode}):\n{err0}\n{err1}")
if err0.count("refused a launcher from 127.0.0.1") != 2:
    h.fail(f"machine 0's launcher did not name each refused JOIN in one line:\n{err0}")
if "closed the connection from 127.0.0.1: it sent a line longer than 16384 bytes" not in err0:
    h.fail(f"machine 0's launcher did not name the flooding connection:\n{err0}")
if token in out0 + err0 + out1 + err1:
    h.fail("the run token was printed")
print("ok: machine 0's launcher listens on 127.0.0.1, refused 2 JOINs and a flood, then ran with machine 1")

# 4. A link planted as a rank's log file is not written through.
import tempfile
with tempfile.TemporaryDirectory() as d:
    victim = os.path.join(d, "victim.txt")
    with open(victim, "w") as f:
        f.write("keep me\n")
    logs = os.path.join(d, "logs")
    os.makedirs(logs)
    os.symlink(victim, os.path.join(logs, "rank_0.log"))
    p = h.run(h.hasten("launch", "--num_processes", "1", "--log_dir", logs, WORKER, "--steps", "1"), timeout=120)
    h.check_clean_failure(p, "a rank log that is a symbolic link", "a symbolic link")
    with open(victim) as f:
        if f.read() != "keep me\n":
            h.fail("the launcher wrote through a symbolic link planted as rank_0.log")
print("run trust: OK")
