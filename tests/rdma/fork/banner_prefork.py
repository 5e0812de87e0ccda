#!/usr/bin/env python3
"""A prefork server that speaks first, and its client (tests/rdma/fork_matrix.sh
`prefork_banner`).

    banner_prefork.py serve ADDR PORT [--workers N] [--log F] [--pidfile F]
    banner_prefork.py connect ADDR PORT FILE [--conns K] [--timeout SECS]

serve: the master listens and forks N workers. Each waits on the listener in its own epoll
set, accepts one connection per readiness (nonblocking, as nginx does without
multi_accept) and, while it serves it, takes the listener out of its set (as nginx's
worker that lost the accept_mutex does). Serving: at once, before reading anything, a
header line `banner pid=P n=N` and N bytes of `pattern(N)`; then it reads the client's
bytes until its half-close and answers `digest up=<sha256> n=<count> pid=P`. Log lines:
`worker pid=W`, `accept pid=W`, `served pid=W n=..`, `error pid=W ...`. SIGTERM: the
master stops the workers and exits 0.

connect: K connections at once, each reads the banner (its bytes checked against
`pattern(N)`), sends FILE, half-closes and checks the digest. Prints `conn I ok pid=P ...`
per connection, then `ok K/K connections tx=T rx=R pids=..`; exit 0 only if all checked out.
"""

import argparse
import hashlib
import os
import select
import signal
import socket
import sys
import threading
import time

from forklib import prefork, read_digest, until_sigterm

BANNER = 256 * 1024


def pattern(n):
    block = hashlib.sha256(b"banner").digest() * 32  # 1 KiB
    return (block * (n // len(block) + 1))[:n]


def log(path, line):
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def serve_one(c, logf):
    me = os.getpid()
    c.setblocking(True)
    c.sendall(f"banner pid={me} n={BANNER}\n".encode() + pattern(BANNER))
    d, n = read_digest(c)
    c.sendall(f"digest up={d} n={n} pid={me}\n".encode())
    c.close()
    log(logf, f"served pid={me} n={n}")


def worker(ls, logf):
    me = os.getpid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    log(logf, f"worker pid={me}")
    ep = select.epoll()
    ep.register(ls.fileno(), select.EPOLLIN)
    while True:
        if not ep.poll(1):
            continue
        try:
            c, _ = ls.accept()
        except BlockingIOError:
            continue
        log(logf, f"accept pid={me}")
        ep.unregister(ls.fileno())
        try:
            serve_one(c, logf)
        except OSError as e:
            log(logf, f"error pid={me} {type(e).__name__}: {e}")
        ep.register(ls.fileno(), select.EPOLLIN)


def serve(a):
    kids = prefork(a.addr, a.port, a.workers, worker, a.log)
    if a.pidfile:
        with open(a.pidfile, "w") as f:
            f.write(f"{os.getpid()}\n")
    until_sigterm(kids)


def one(a, payload):
    c = socket.create_connection((a.addr, a.port), timeout=a.timeout)
    f = c.makefile("rb")
    head = f.readline().decode().split()
    kv = dict(x.split("=", 1) for x in head[1:])
    if head[:1] != ["banner"] or int(kv.get("n", -1)) != BANNER:
        raise ValueError(f"no banner: {head!r}")
    got = f.read(BANNER)
    if got != pattern(BANNER):
        raise ValueError(f"banner differs ({len(got)} of {BANNER} bytes)")
    time.sleep(a.hold_ms / 1000)  # the connection stays open for the QP sampler
    c.sendall(payload)
    c.shutdown(socket.SHUT_WR)
    tail = f.read().decode(errors="replace").split()
    f.close()
    c.close()
    t = dict(x.split("=", 1) for x in tail[1:])
    sha = hashlib.sha256(payload).hexdigest()
    if tail[:1] != ["digest"] or t.get("up") != sha or t.get("n") != str(len(payload)):
        raise ValueError(f"server received {tail!r}, sent {len(payload)} bytes sha256 {sha}")
    return kv["pid"], len(payload), BANNER


def connect(a):
    payload = open(a.file, "rb").read()
    results = [None] * a.conns

    def run(i):
        try:
            results[i] = one(a, payload)
        except Exception as e:
            results[i] = e

    ts = [threading.Thread(target=run, args=(i,)) for i in range(a.conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ok, tx, rx, pids = 0, 0, 0, set()
    for i, r in enumerate(results):
        if isinstance(r, tuple):
            pid, t, x = r
            print(f"conn {i} ok pid={pid} up={t} down={x} tx={t} rx={x}", flush=True)
            ok, tx, rx = ok + 1, tx + t, rx + x
            pids.add(pid)
        else:
            print(f"conn {i} FAIL {type(r).__name__}: {r}", flush=True)
    word = "ok" if ok == a.conns else "FAILED"
    n = ok if ok == a.conns else a.conns - ok
    print(f"{word} {n}/{a.conns} connections tx={tx} rx={rx} pids={','.join(sorted(pids))}")
    return 0 if ok == a.conns else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serve", "connect"])
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("file", nargs="?")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--log")
    p.add_argument("--pidfile")
    p.add_argument("--conns", type=int, default=1)
    p.add_argument("--timeout", type=int, default=60)
    p.add_argument("--hold-ms", type=int, default=0)
    a = p.parse_args()
    return serve(a) if a.mode == "serve" else connect(a)


if __name__ == "__main__":
    sys.exit(main())
