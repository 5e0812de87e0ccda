#!/usr/bin/env python3
"""Checks the addresses of tests/rdma/dualstack.sh's cells.

usage: check.py SERVER_REPORT ADDR PORT CLIENT_REPORT:KIND...
  ADDR  the server's IPv4 address
  KIND  v4      AF_INET client to ADDR    (its names: sockaddr_in, 16 bytes)
        mapped  AF_INET6 client to ::ffff:ADDR
        v6      AF_INET6 client to a native IPv6 address
Connection i of the server report is client i's. What the kernel returns on the server's
AF_INET6 socket: an IPv4 peer as ::ffff:a.b.c.d in a 28-byte sockaddr_in6, flowinfo and
scope id 0; accept()'s address equal to getpeername's; both ends agreeing on the ports.
Prints one line per mismatch; exit 1 if any.
"""

import json
import socket
import sys

srv_path, a4, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
conns = [json.loads(line) for line in open(srv_path) if line.strip()]
clients = [a.rsplit(":", 1) for a in sys.argv[4:]]
bad = []


def want(what, got, **exp):
    for k, v in exp.items():
        if got.get(k) != v:
            bad.append(f"{what}: {k}={got.get(k)!r}, want {v!r} (all: {got})")


def v6(addr, p):
    return dict(len=28, family=socket.AF_INET6, addr=addr, port=p, flowinfo=0, scope_id=0)


def v4(addr, p):
    return dict(len=16, family=socket.AF_INET, addr=addr, port=p)


if len(conns) != len(clients):
    bad.append(f"server reports {len(conns)} connections, want {len(clients)}")
for i, (conn, (path, kind)) in enumerate(zip(conns, clients)):
    cli = json.load(open(path))
    cport = cli["local"].get("port")
    host = cli["local"].get("addr")
    # The client's own names.
    if kind == "v4":
        want(f"client {i} getsockname", cli["local"], **v4(a4, cport))
        want(f"client {i} getpeername", cli["peer"], **v4(a4, port))
        seen = "::ffff:" + str(host)
    else:
        want(f"client {i} getsockname", cli["local"], **v6(host, cport))
        want(f"client {i} getpeername", cli["peer"], **v6(cli["peer"].get("addr"), port))
        if kind == "mapped":
            want(f"client {i} getpeername", cli["peer"], addr="::ffff:" + a4)
            want(f"client {i} getsockname", cli["local"], addr="::ffff:" + a4)
        seen = host
    # The server's view of it, in the mapped form for an IPv4 client.
    want(f"server conn {i} getpeername", conn["peer"], **v6(seen, cport))
    here = "::ffff:" + a4 if kind != "v6" else cli["peer"].get("addr")
    want(f"server conn {i} getsockname", conn["local"], **v6(here, port))
    acc = conn["accepted"]
    if acc != [seen, cport, 0, 0]:
        bad.append(f"server conn {i} accept() address {acc}, want {[seen, cport, 0, 0]}")
for line in bad:
    print(line)
sys.exit(1 if bad else 0)
