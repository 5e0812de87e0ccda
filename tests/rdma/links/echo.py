"""Shared by the link cells' programs (tests/rdma/links.sh): an echo server's connection
and a burst of short verified connections."""
import socket


def serve(c):
    """Echoes `c`'s bytes until it ends."""
    with c:
        while True:
            b = c.recv(4096)
            if not b:
                return
            c.sendall(b)


def burst(addr, port, n, tag):
    """N connections one after another: 16 bytes each way, verified, then closed."""
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
