#!/usr/bin/env python3
"""A socket-activated echo server (systemd's protocol: fd 3, LISTEN_FDS=1, LISTEN_PID=our
pid), as `systemd-socket-activate -l ADDR:PORT activated_echo.py N LOG` starts it: fd 3 is
the listener; it serves N connections, each echoed until EOF on its own thread. With
`--accept` (inetd style: one process per connection) fd 3 is the connection itself, echoed
until EOF. LOG gets `serve pid=P conn=I` and `served pid=P conn=I bytes=B` lines."""
import os
import socket
import sys
import threading

n, logpath = int(sys.argv[1]), sys.argv[2]
if os.environ.get("LISTEN_FDS") != "1" or os.environ.get("LISTEN_PID") != str(os.getpid()):
    sys.exit(f"not socket-activated: LISTEN_FDS={os.environ.get('LISTEN_FDS')} LISTEN_PID={os.environ.get('LISTEN_PID')}")
fd3 = socket.socket(fileno=3)


def log(line):
    with open(logpath, "a") as f:
        f.write(line + "\n")


def echo(conn, i):
    total = 0
    with conn:
        while True:
            b = conn.recv(65536)
            if not b:
                break
            conn.sendall(b)
            total += len(b)
        conn.shutdown(socket.SHUT_WR)
    log(f"served pid={os.getpid()} conn={i} bytes={total}")


if not fd3.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
    log(f"serve pid={os.getpid()} conn=0")
    echo(fd3, 0)
    sys.exit(0)
threads = []
for i in range(n):
    c, _ = fd3.accept()
    log(f"serve pid={os.getpid()} conn={i}")
    t = threading.Thread(target=echo, args=(c, i))
    t.start()
    threads.append(t)
for t in threads:
    t.join()
