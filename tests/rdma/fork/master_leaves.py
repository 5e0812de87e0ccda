#!/usr/bin/env python3
"""A master that listens, forks workers that wait on the listener in epoll, then leaves:
it re-execs itself (haproxy's master-worker mode does, keeping the listener) or exits (a
daemon that listens, then detaches). The workers serve the fork test protocol
(examples/support/fork_proto.rs: `E` echo with a sha256 trailer) one connection at a time.
Used by tests/rdma/fork_matrix.sh (`master_leaves_*`).

usage: master_leaves.py ADDR PORT --leave exec|exit --log FILE --pidfile F [--workers N]

The pid file lists the workers' pids once every worker waits in epoll_wait; the master
leaves right after. Workers run until SIGTERM. Event log lines: `worker pid=W`, `accept
pid=W`, `served pid=W up=N`, `error pid=W ...`, `master-exec pid=P`.
"""

import argparse
import os
import select
import signal
import socket
import sys

from forklib import log_line as log, read_digest


def worker(ready_w):
    def run(ls, logf):
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        ep = select.epoll()
        ep.register(ls.fileno(), select.EPOLLIN)
        log(logf, f"worker pid={os.getpid()}")
        os.write(ready_w, f"{os.getpid()}\n".encode())
        while True:
            for _ in ep.poll():
                try:
                    c, _ = ls.accept()
                except BlockingIOError:
                    continue  # another worker took it
                log(logf, f"accept pid={os.getpid()}")
                serve(c, logf)

    return run


def serve(c, logf):
    try:
        c.setblocking(True)
        c.settimeout(60)
        if c.recv(1) != b"E":
            raise ValueError("not an echo request")
        d, n = read_digest(c, echo=True)
        c.sendall(f"digest up={d} n={n} down={d} m={n} pid={os.getpid()}\n".encode())
        log(logf, f"served pid={os.getpid()} up={n}")
    except Exception as e:
        log(logf, f"error pid={os.getpid()} {type(e).__name__}: {e}")
    finally:
        c.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("--leave", choices=["exec", "exit"], required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--pidfile", required=True)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    ready_r, ready_w = os.pipe()
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.addr, a.port))
    ls.listen(64)
    ls.setblocking(False)
    run, kids = worker(ready_w), []
    for _ in range(a.workers):
        pid = os.fork()
        if pid == 0:
            try:
                run(ls, a.log)
            finally:
                os._exit(1)
        kids.append(pid)
    got = b""
    while got.count(b"\n") < a.workers:
        got += os.read(ready_r, 4096)
    with open(a.pidfile + ".tmp", "w") as f:
        f.write(got.decode())
    os.rename(a.pidfile + ".tmp", a.pidfile)
    if a.leave == "exit":
        sys.exit(0)
    # haproxy's master re-execs itself with the listener open: a program that only holds it.
    os.set_inheritable(ls.fileno(), True)
    log(a.log, f"master-exec pid={os.getpid()} workers={','.join(map(str, kids))}")
    os.execvp("sleep", ["sleep", "600"])


if __name__ == "__main__":
    main()
