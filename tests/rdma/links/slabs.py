#!/usr/bin/env python3
"""A link's memory grows with its streams and shrinks after them (tests/rdma/links.sh,
links_slabs).

client ADDR PORT N STEP: one connection (16 bytes each way, verified) held open, prints
"one" and waits for the file STEP.1; then N more held open at once, each verified, prints
"many" and waits for STEP.2; closes those N, prints "few" and waits for STEP.3; closes the
first and prints "ok". (The server is idle.py's: it echoes every connection.)
"""
import os, sys, time

from echo import opened


def wait_for(path):
    for _ in range(1200):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    raise SystemExit(f"no {path} within 60 s")


def client(addr, port, n, step):
    first = opened(addr, port, "first")
    print("one", flush=True)
    wait_for(step + ".1")
    more = [opened(addr, port, f"m{i:03d}") for i in range(n)]
    print("many", flush=True)
    wait_for(step + ".2")
    for s in more:
        s.close()
    time.sleep(1)  # the CLOSEs pass, the slots come back
    print("few", flush=True)
    wait_for(step + ".3")
    first.close()
    print("ok", flush=True)


if __name__ == "__main__":
    client(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
