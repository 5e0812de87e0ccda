#!/usr/bin/env python3
"""Each connection over a link has its own port (tests/rdma/links.sh, links_ports).

server ADDR PORT N: accepts N connections, tells each the peer port it sees
(getpeername) as a line, and waits for its end.
client ADDR PORT N: N connections open together; each one's local port (getsockname) must
be the peer port the server saw, and no two alike. Prints "ok" and the ports.
"""
import socket, sys


def server(addr, port, n):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(64)
    conns = []
    for _ in range(n):
        c, peer = l.accept()
        seen = c.getpeername()
        if seen != peer:
            raise SystemExit(f"accept said {peer}, getpeername {seen}")
        c.sendall(f"{seen[1]}\n".encode())
        conns.append(c)
    for c in conns:
        while c.recv(64):
            pass
        c.close()


def client(addr, port, n):
    socks, mine = [], []
    for i in range(n):
        s = socket.create_connection((addr, port))
        socks.append(s)
        got = b""
        while not got.endswith(b"\n"):
            b = s.recv(64)
            if not b:
                raise SystemExit(f"connection {i}: end of stream")
            got += b
        local = s.getsockname()[1]
        if int(got) != local:
            raise SystemExit(f"connection {i}: local port {local}, the server sees {int(got)}")
        mine.append(local)
    if len(set(mine)) != n:
        raise SystemExit(f"ports not all different: {mine}")
    for s in socks:
        s.close()
    print("ok", " ".join(map(str, mine)), flush=True)


if __name__ == "__main__":
    (server if sys.argv[1] == "server" else client)(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
