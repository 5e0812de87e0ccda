#!/usr/bin/env python3
"""Echo client for relays that cannot take a half-close or full-duplex bulk traffic
(`ncat --sh-exec cat` copies with blocking writes into cat's pipe and closes the connection
when the socket reads end of stream — on kernel TCP too): per connection, sends BYTES (kept
below a pipe's capacity), reads exactly BYTES back, checks them, closes.

usage: raw_echo_client.py ADDR PORT BYTES CONNS [--timeout SECS]
Prints `conn I ok rx=N` per connection, then `ok K/K connections tx=T rx=R`; exit 0 only if
every connection checked out.
"""
import hashlib
import os
import socket
import sys


def main():
    addr, port, n, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--timeout" else 60
    ok = tx = rx = 0
    for i in range(conns):
        payload = os.urandom(n)
        try:
            c = socket.create_connection((addr, port), timeout=timeout)
            c.sendall(payload)
            tx += n
            got = bytearray()
            while len(got) < n:
                b = c.recv(65536)
                if not b:
                    break
                got.extend(b)
            c.close()
            rx += len(got)
            if hashlib.sha256(got).digest() == hashlib.sha256(payload).digest():
                ok += 1
                print(f"conn {i} ok rx={len(got)}")
            else:
                print(f"conn {i} FAIL rx={len(got)} of {n} (bytes differ or short)")
        except OSError as e:
            print(f"conn {i} FAIL {e}")
    print(f"{'ok' if ok == conns else 'FAILED'} {ok}/{conns} connections tx={tx} rx={rx}")
    return 0 if ok == conns else 1


if __name__ == "__main__":
    sys.exit(main())
