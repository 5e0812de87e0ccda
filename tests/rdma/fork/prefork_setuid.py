#!/usr/bin/env python3
"""A prefork server whose workers drop root *after* they added the listener to their epoll
set (the order some servers use): under RSOCK_REDIRECT=1 each worker has made a branch
before setuid, which must go with the old credentials, and a new one come after. Serves the
fork test protocol's `E` echo (as forking_server.py) one connection at a time per worker.

usage: prefork_setuid.py ADDR PORT --workers N --log FILE --pidfile FILE
Logs `worker pid=P uid=U` once a worker dropped root, `served pid=P op=E up=N` per echo.
"""

import argparse
import os
import select

from forklib import log_line as log, prefork, read_digest, until_sigterm


def echo(c):
    c.settimeout(60)
    if c.recv(1) != b"E":
        raise ValueError("unknown operation byte")
    d, n = read_digest(c, echo=True)
    c.sendall(f"digest up={d} n={n} down={d} m={n} pid={os.getpid()}\n".encode())
    return n


def worker(l, logf):
    ep = select.epoll()
    ep.register(l.fileno(), select.EPOLLIN)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    log(logf, f"worker pid={os.getpid()} uid={os.getuid()}")
    while True:
        ep.poll()
        try:
            c, _ = l.accept()
        except BlockingIOError:
            continue
        with c:
            c.setblocking(True)
            try:
                n = echo(c)
                log(logf, f"served pid={os.getpid()} op=E up={n}")
            except Exception as e:
                log(logf, f"error pid={os.getpid()} {type(e).__name__}: {e}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--log", required=True)
    p.add_argument("--pidfile", required=True)
    a = p.parse_args()
    # The workers log as nobody: the file is made here, writable by them.
    os.close(os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666))
    os.chmod(a.log, 0o666)
    kids = prefork(a.addr, a.port, a.workers, worker, a.log)
    with open(a.pidfile, "w") as f:
        f.write(f"{os.getpid()}\n")
    until_sigterm(kids)


if __name__ == "__main__":
    main()
