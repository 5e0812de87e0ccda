#!/usr/bin/env python3
"""Socket options an RDMA stream follows itself, set before and after connect.

server ADDR PORT N: accepts N connections; each says what it is on its first line:
  "silent NAME": sends nothing for 1.5 s, then "late\n", then closes;
  "reset NAME": reads until the end and prints "NAME eof" or "NAME reset" (ECONNRESET).
client ADDR PORT: runs the cases below and prints "NAME ok" or "NAME FAIL why" for each.
"""
import socket, struct, sys, threading, time

SILENT_S = 1.5
TIMEO = struct.pack("ll", 0, 300_000)  # SO_RCVTIMEO 300 ms
LINGER0 = struct.pack("ii", 1, 0)


def serve(c):
    f = c.makefile("rb")
    kind, name = f.readline().decode().split()
    if kind == "silent":
        time.sleep(SILENT_S)
        c.sendall(b"late\n")
        c.close()
        return
    try:
        while c.recv(65536):
            pass
        print(f"{name} eof", flush=True)
    except ConnectionResetError:
        print(f"{name} reset", flush=True)
    c.close()


def server(addr, port, n):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(16)
    ts = []
    for _ in range(n):
        c, _ = l.accept()
        t = threading.Thread(target=serve, args=(c,))
        t.start()
        ts.append(t)
    for t in ts:
        t.join()


def rcvtimeo(addr, port, name, before):
    s = socket.socket()
    if before:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, TIMEO)
    s.connect((addr, port))
    if not before:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, TIMEO)
    s.sendall(f"silent {name}\n".encode())
    t0 = time.monotonic()
    try:
        got = s.recv(16)
        return f"recv returned {got!r} after {time.monotonic() - t0:.2f} s, want EAGAIN"
    except BlockingIOError:
        took = time.monotonic() - t0
    if not 0.25 <= took <= 1.2:
        return f"EAGAIN after {took:.2f} s, want about 0.3 s"
    # The stream still works after a timeout: the late line arrives.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            got = s.recv(16)
            s.close()
            return None if got == b"late\n" else f"then read {got!r}, want b'late\\n'"
        except BlockingIOError:
            continue
    return "the late line never came"


def linger(addr, port, name, when):
    s = socket.socket()
    if when == "before":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
    s.connect((addr, port))
    if when == "after":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
    s.sendall(f"reset {name}\n".encode() + b"x" * 1000)
    time.sleep(0.3)  # the server has read it all by now
    s.close()
    return None


def client(addr, port):
    cases = [
        ("rcvtimeo_before", lambda n: rcvtimeo(addr, port, n, True)),
        ("rcvtimeo_after", lambda n: rcvtimeo(addr, port, n, False)),
        ("linger0_before", lambda n: linger(addr, port, n, "before")),
        ("linger0_after", lambda n: linger(addr, port, n, "after")),
        ("linger_unset", lambda n: linger(addr, port, n, "never")),
    ]
    for name, case in cases:
        try:
            why = case(name)
        except Exception as e:  # noqa: BLE001 - reported, the cell fails on it
            why = f"{type(e).__name__}: {e}"
        print(f"{name} ok" if why is None else f"{name} FAIL {why}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        client(sys.argv[2], int(sys.argv[3]))
