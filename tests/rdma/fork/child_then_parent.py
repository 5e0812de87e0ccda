#!/usr/bin/env python3
"""A client whose fork children use its connection and exit while it holds on to it, as a
shell's subshell writing to a `/dev/tcp` fd does (found 2026-11-29: the connection ended
with the first such child). Against examples/fork_echo (`E` echo, the fork test protocol):
the parent sends `E`; then six fork children in turn each send an 8 KiB part of FILE and
exit — with os._exit, with exit(), or after reading the part's echo itself — and the
parent, once the child is gone, reads the echo of the part (unless the child did) and
checks it. (A part's echo must fit the buffers while nobody reads: a child that does not
read would otherwise wait for the parent, which waits for the child.) The parent sends the
rest of FILE itself from a writer thread while it reads, shuts down, and checks the rest
of the echo and the server's trailer (the sha256 of all it received).

usage: child_then_parent.py ADDR PORT FILE

Prints `child K MODE ok` per child, `conn 0 ok pid=P up=N up_sha=.. tx=.. rx=..` and `ok
1/1 connections ...` as echo_client.py does; exit 0 only if everything checked out.
"""

import hashlib
import os
import socket
import sys
import threading

from echo_client import check_trailer, read_to_end

MODES = ["_exit", "exit", "reads"] * 2
PART = 8192


def recv_exactly(c, n):
    got = bytearray()
    while len(got) < n:
        d = c.recv(n - len(got))
        if not d:
            raise EOFError(f"EOF after {len(got)} of {n} bytes")
        got += d
    return bytes(got)


def child(c, part, mode):
    """In the fork child: send `part`, read its echo if `mode` says so, exit."""
    try:
        c.sendall(part)
        if mode == "reads" and recv_exactly(c, len(part)) != part:
            os._exit(3)
    except Exception:
        os._exit(2)
    if mode == "exit":
        sys.exit(0)
    os._exit(0)


def main():
    addr, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    payload = open(path, "rb").read()
    parts = [payload[i * PART:(i + 1) * PART] for i in range(len(MODES))]
    c = socket.create_connection((addr, port), timeout=60)
    c.sendall(b"E")
    rx = 0
    for k, (part, mode) in enumerate(zip(parts, MODES)):
        pid = os.fork()
        if pid == 0:
            child(c, part, mode)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"conn 0 FAIL child {k} ({mode}) exited with status {status:#x}")
        if mode != "reads" and recv_exactly(c, len(part)) != part:
            raise SystemExit(f"conn 0 FAIL the echo of child {k}'s part differs")
        rx += len(part)  # by the parent, or the child
        print(f"child {k} {mode} ok", flush=True)
    last = payload[len(MODES) * PART:]

    def writer():
        c.sendall(last)
        c.shutdown(socket.SHUT_WR)

    w = threading.Thread(target=writer)
    w.start()
    echo = recv_exactly(c, len(last))
    w.join()
    if echo != last:
        raise SystemExit("conn 0 FAIL the echo of the parent's part differs")
    rx += len(last)
    tail = read_to_end(c)
    try:
        kv = check_trailer(tail, payload)
    except ValueError as e:
        raise SystemExit(f"conn 0 FAIL {e}")
    sha = hashlib.sha256(payload).hexdigest()
    tx = 1 + len(payload)
    rx += len(tail)
    print(f"conn 0 ok pid={kv.get('pid')} up={len(payload)} up_sha={sha} tx={tx} rx={rx}")
    print(f"ok 1/1 connections tx={tx} rx={rx} pids={kv.get('pid')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
