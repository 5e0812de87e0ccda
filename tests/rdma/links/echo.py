"""Shared by the link cells' programs (tests/rdma/links.sh): an echo server's connection,
a verified connection, and a burst of them."""
import socket


def serve(c):
    """Echoes `c`'s bytes until it ends."""
    with c:
        while True:
            b = c.recv(4096)
            if not b:
                return
            c.sendall(b)


def opened(addr, port, tag):
    """A connection with 16 bytes echoed and verified, left open."""
    s = socket.create_connection((addr, port))
    msg = f"{tag}-pattern-0123456"[:16].encode()
    s.sendall(msg)
    got = b""
    while len(got) < len(msg):
        b = s.recv(64)
        if not b:
            raise SystemExit(f"connection {tag}: end of stream after {got!r}")
        got += b
    if got != msg:
        raise SystemExit(f"connection {tag}: echoed {got!r}, sent {msg!r}")
    return s


def burst(addr, port, n, tag):
    """N connections one after another: 16 bytes each way, verified, then closed."""
    for i in range(n):
        opened(addr, port, f"{tag}{i:06d}").close()
