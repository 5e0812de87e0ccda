#!/usr/bin/env python3
"""A nonblocking writer that waits in select(), as iperf3's client does (tests/rdma/links.sh,
links_nonblocking).

server ADDR PORT: takes one connection, reads it to its end in 16 KiB reads (slower than
the writer, which then waits for credits as well as for its buffer), prints "got BYTES
SHA256".
client ADDR PORT BYTES: sends BYTES of a deterministic pattern from a nonblocking socket in
128 KiB writes, select()ing for writability whenever a write is short or EAGAIN, then
half-closes, waits for the server's end and prints "sent BYTES SHA256".
"""
import hashlib, select, socket, sys

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
    h, got = hashlib.sha256(), 0
    while True:
        d = c.recv(16384)
        if not d:
            break
        h.update(d)
        got += len(d)
    c.close()
    print(f"got {got} {h.hexdigest()}", flush=True)


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
