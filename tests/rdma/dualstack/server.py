#!/usr/bin/env python3
"""Dual-stack echo server for tests/rdma/dualstack.sh.

usage: server.py MODE PORT COUNT REPORT
  MODE  dual     socket.create_server(("", PORT), family=AF_INET6, dualstack_ipv6=True)
        v6only   an AF_INET6 socket with IPV6_V6ONLY=1 bound to [::]:PORT
        ADDR     an AF_INET6 socket with IPV6_V6ONLY=0 bound to [ADDR]:PORT (e.g. ::ffff:10.77.0.1)
Accepts COUNT connections one after another; echoes each until the peer's EOF, then closes.
Appends one JSON line per connection to REPORT: what accept() returned (Python's tuple and
the raw sockaddr of the C call), getpeername/getsockname raw, bytes echoed.
"""

import json
import socket
import sys

from names import names, raw

mode, port, count, report = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if mode == "dual":
    srv = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
else:
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if mode == "v6only" else 0)
    srv.bind(("::" if mode == "v6only" else mode, port))
    srv.listen(8)
listener = raw("getsockname", srv)
for _ in range(count):
    c, accepted = srv.accept()
    rec = {"accepted": list(accepted), "listener": listener, **names(c)}
    n = 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        c.sendall(b)
        n += len(b)
    rec["bytes"] = n
    c.close()
    with open(report, "a") as f:
        f.write(json.dumps(rec) + "\n")
