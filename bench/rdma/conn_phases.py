#!/usr/bin/env python3
"""bench/rdma/conn-phases.sh's client: N sequential HTTP/1.1 `GET /4k.bin` with
`Connection: close` to HOST:PORT, each read to EOF; prints the medians (ms) of socket(),
connect(), the request to EOF, close(), and the whole, after LABEL.

usage: conn_phases.py HOST PORT N LABEL
"""
import socket, sys, time, statistics
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ph = {k: [] for k in ("socket", "connect", "request", "close", "total")}
req = b"GET /4k.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
t_start = time.perf_counter()
for i in range(n):
    t0 = time.perf_counter()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t1 = time.perf_counter()
    s.connect((host, port))
    t2 = time.perf_counter()
    s.sendall(req)
    got = 0
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += len(d)
    t3 = time.perf_counter()
    s.close()
    t4 = time.perf_counter()
    for k, v in zip(ph, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
        ph[k].append(v * 1e3)
el = time.perf_counter() - t_start
print(f"{sys.argv[4]}: {n} in {el:.2f}s ({n/el:.0f}/s) medians ms: " + " ".join(f"{k}={statistics.median(v):.2f}" for k, v in ph.items()))
