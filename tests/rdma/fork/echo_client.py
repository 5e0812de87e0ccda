#!/usr/bin/env python3
"""Python client of the fork test protocol (examples/support/fork_proto.rs), `E` echo:
sends `E` + the payload from a writer thread while the main thread reads the echo, then
checks that exactly the payload came back and that the server's trailer reports its sha256.
Used by tests/rdma/fork_matrix.sh (and imported by spawn_during_transfer.py).

usage: echo_client.py ADDR PORT FILE [--conns K] [--pause-ms MS] [--timeout SECS]

Prints `conn I ok pid=P up=N up_sha=.. tx=.. rx=..` per connection, then `ok K/K
connections tx=T rx=R pids=..`; exit 0 only if every connection checked out.
"""

import argparse
import hashlib
import os
import socket
import sys
import threading
import time


def transfer(addr, port, payload, chunk=65536, between=None, pause_ms=0, timeout=60):
    """One echo connection. `between(k)` is called in the writer thread after chunk k.
    Returns (server_pid, tx, rx); raises on any mismatch."""
    c = socket.create_connection((addr, port), timeout=timeout)
    errs = []

    def writer():
        try:
            c.sendall(b"E")
            half = len(payload) // 2
            for k, off in enumerate(range(0, len(payload), chunk)):
                if pause_ms and off <= half < off + chunk:
                    time.sleep(pause_ms / 1000)
                c.sendall(payload[off:off + chunk])
                if between:
                    between(k)
            c.shutdown(socket.SHUT_WR)
        except Exception as e:  # reported by the reader's caller
            errs.append(f"writer: {type(e).__name__}: {e}")

    w = threading.Thread(target=writer)
    w.start()
    got = bytearray()
    try:
        while len(got) < len(payload):
            d = c.recv(min(1 << 20, len(payload) - len(got)))
            if not d:
                raise EOFError(f"EOF after {len(got)} of {len(payload)} echoed bytes")
            if d != payload[len(got):len(got) + len(d)]:
                raise ValueError(f"echo differs within bytes {len(got)}..{len(got) + len(d)}")
            got += d
        tail = read_to_end(c)
    finally:
        w.join()
        c.close()
    if errs:
        raise RuntimeError("; ".join(errs))
    kv = check_trailer(tail, payload)
    return kv.get("pid"), 1 + len(payload), len(got) + len(tail)


def read_to_end(c):
    """What `c` holds until the peer's half-close (the server's trailer, after the echo)."""
    tail = bytearray()
    while True:
        d = c.recv(4096)
        if not d:
            return bytes(tail)
        tail += d


def check_trailer(tail, payload):
    """The server's `digest up=<sha256> n=<count> ...` trailer as a dict; raises ValueError
    unless it names exactly `payload`."""
    t = tail.decode(errors="replace")
    if not t.startswith("digest "):
        raise ValueError(f"no trailer: {t!r}")
    kv = dict(x.split("=", 1) for x in t.split()[1:])
    sha = hashlib.sha256(payload).hexdigest()
    if kv.get("up") != sha or kv.get("n") != str(len(payload)):
        raise ValueError(f"server received n={kv.get('n')} up={kv.get('up')}, sent {len(payload)} bytes sha256 {sha}")
    return kv


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("file")
    p.add_argument("--conns", type=int, default=1)
    p.add_argument("--pause-ms", type=int, default=0)
    p.add_argument("--timeout", type=int, default=60)
    a = p.parse_args()
    payload = open(a.file, "rb").read()
    sha = hashlib.sha256(payload).hexdigest()
    ok, tx, rx, pids = 0, 0, 0, set()
    for i in range(a.conns):
        try:
            pid, t, r = transfer(a.addr, a.port, payload, pause_ms=a.pause_ms, timeout=a.timeout)
            print(f"conn {i} ok pid={pid} up={len(payload)} up_sha={sha} tx={t} rx={r}", flush=True)
            ok, tx, rx = ok + 1, tx + t, rx + r
            pids.add(pid)
        except Exception as e:
            print(f"conn {i} FAIL {type(e).__name__}: {e}", flush=True)
    word = "ok" if ok == a.conns else "FAILED"
    print(f"{word} {ok if ok == a.conns else a.conns - ok}/{a.conns} connections tx={tx} rx={rx} pids={','.join(sorted(pids))}")
    return 0 if ok == a.conns else 1


if __name__ == "__main__":
    sys.exit(main())
