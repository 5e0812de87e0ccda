#!/usr/bin/env python3
"""A listener that closes while its link lives (tests/rdma/links.sh, links_listener_gone).

server ADDR PORT N SYNC: accepts N connections (each echoed until it ends), closes the
listener, touches SYNC.closed; once SYNC.refused exists listens again on the same port,
touches SYNC.again, and echoes N more connections.
client ADDR PORT N SYNC: N connections (16 bytes each way, verified); once SYNC.closed
exists, 5 connects that must each be refused at once (ECONNREFUSED: a stream granted ahead
must not make a connect succeed to a listener that is gone); touches SYNC.refused; once
SYNC.again exists, N more connections. Prints "ok" at the end.
"""
import os, socket, sys, threading, time

from echo import burst, serve


def wait_for(path, secs=60):
    end = time.monotonic() + secs
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.05)


def touch(path):
    open(path, "w").close()


def listen_and_serve(addr, port, n, listening=lambda: None):
    """Listens, calls `listening`, serves N connections (threads) and closes the listener:
    the threads."""
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(64)
    listening()
    threads = []
    for _ in range(n):
        c, _ = l.accept()
        t = threading.Thread(target=serve, args=(c,))
        t.start()
        threads.append(t)
    l.close()
    return threads


def server(addr, port, n, sync):
    first = listen_and_serve(addr, port, n)
    touch(sync + ".closed")
    wait_for(sync + ".refused")
    # The listener is made and listening before the client is told.
    again = listen_and_serve(addr, port, n, lambda: touch(sync + ".again"))
    for t in first + again:
        t.join()


def client(addr, port, n, sync):
    burst(addr, port, n, "a")
    wait_for(sync + ".closed")
    for i in range(5):
        t = time.monotonic()
        s = socket.socket()
        s.settimeout(30)
        try:
            s.connect((addr, port))
            raise SystemExit(f"connect {i} to a closed listener succeeded")
        except ConnectionRefusedError:
            pass
        finally:
            s.close()
        took = time.monotonic() - t
        if took > 10:
            raise SystemExit(f"connect {i} took {took:.1f} s to be refused")
    print("refused", flush=True)
    touch(sync + ".refused")
    wait_for(sync + ".again")
    burst(addr, port, n, "b")
    print("ok", flush=True)


if __name__ == "__main__":
    role, addr, port, n, sync = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    (server if role == "server" else client)(addr, port, n, sync)
