#!/usr/bin/env python3
"""A link that goes idle (tests/rdma/links.sh, links_idle).

server ADDR PORT: echoes every connection's bytes until it ends, for ever.
client ADDR PORT N PAUSE_S: N connections one after another (16 bytes each way, verified,
then closed), prints "idle", sleeps PAUSE_S with no connection open, then N more; prints
"ok" at the end.
"""
import socket, sys, threading, time


def serve(c):
    with c:
        while True:
            b = c.recv(4096)
            if not b:
                return
            c.sendall(b)


def server(addr, port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(64)
    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def burst(addr, port, n, tag):
    for i in range(n):
        with socket.create_connection((addr, port)) as s:
            msg = f"{tag}-{i:06d}-pattern"[:16].encode()
            s.sendall(msg)
            got = b""
            while len(got) < len(msg):
                b = s.recv(64)
                if not b:
                    raise SystemExit(f"connection {tag}{i}: end of stream after {got!r}")
                got += b
            if got != msg:
                raise SystemExit(f"connection {tag}{i}: echoed {got!r}, sent {msg!r}")


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
