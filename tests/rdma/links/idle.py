#!/usr/bin/env python3
"""A link that goes idle (tests/rdma/links.sh, links_idle).

server ADDR PORT: echoes every connection's bytes until it ends, for ever.
client ADDR PORT N PAUSE_S: N connections one after another (16 bytes each way, verified,
then closed), prints "idle", sleeps PAUSE_S with no connection open, then N more; prints
"ok" at the end.
"""
import socket, sys, threading, time

from echo import burst, serve


def server(addr, port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(64)
    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def client(addr, port, n, pause):
    burst(addr, port, n, "a")
    print("idle", flush=True)
    time.sleep(pause)
    burst(addr, port, n, "b")
    print("ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]))
    else:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
