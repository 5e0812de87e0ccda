#!/usr/bin/env python3
"""A nonblocking writer that waits in select(), as iperf3's client does (tests/rdma/links.sh,
links_nonblocking).

server ADDR PORT: takes one connection, reads it to its end, prints "got BYTES SHA256".
client ADDR PORT BYTES: sends BYTES of a deterministic pattern from a nonblocking socket in
128 KiB writes, select()ing for writability whenever a write is short or EAGAIN, then
half-closes, waits for the server's end and prints "sent BYTES SHA256".
"""
import hashlib, os, select, socket, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fork"))
from forklib import read_digest  # noqa: E402

CHUNK = 128 * 1024


def pattern(n):
    """n bytes of a hash chain: every block differs, so a misplaced block shows."""
    out, seed = bytearray(), b"nb_send"
    while len(out) < n:
        seed = hashlib.sha256(seed).digest()
        out += seed * 64  # 2 KiB per link of the chain
    return bytes(out[:n])


def server(addr, port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(1)
    c, _ = l.accept()
    digest, got = read_digest(c)
    c.close()
    print(f"got {got} {digest}", flush=True)


def client(addr, port, total):
    data = pattern(total)
    s = socket.create_connection((addr, port))
    s.setblocking(False)
    at = 0
    while at < total:
        try:
            n = s.send(data[at:at + CHUNK])
        except BlockingIOError:
            n = 0
        at += n
        if n < CHUNK and at < total:
            select.select([], [s], [], 30)
    s.setblocking(True)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # the server's end: everything was taken
    s.close()
    print(f"sent {total} {hashlib.sha256(data).hexdigest()}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]))
    else:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
