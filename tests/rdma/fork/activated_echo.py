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

from pass_fds import echo, log  # the same echo and log lines as the other passed-fd cells

n, logpath = int(sys.argv[1]), sys.argv[2]
if os.environ.get("LISTEN_FDS") != "1" or os.environ.get("LISTEN_PID") != str(os.getpid()):
    sys.exit(f"not socket-activated: LISTEN_FDS={os.environ.get('LISTEN_FDS')} LISTEN_PID={os.environ.get('LISTEN_PID')}")
fd3 = socket.socket(fileno=3)


def serve(conn, i):
    log(logpath, f"serve pid={os.getpid()} conn={i}")
    echo(conn, i, logpath)


if not fd3.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
    serve(fd3, 0)
    sys.exit(0)
threads = []
for i in range(n):
    c, _ = fd3.accept()
    t = threading.Thread(target=serve, args=(c, i))
    t.start()
    threads.append(t)
for t in threads:
    t.join()
