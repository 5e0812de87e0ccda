"""What the fork test servers share (links/nb_send.py too): reading a connection to its end
with a digest, and a prefork master (a listener, its workers, SIGTERM)."""

import hashlib
import os
import signal
import socket
import sys
import threading


def log_line(path, line):
    """Appends `line` to the event log at `path` in one write (O_APPEND): the lines of
    several processes never mix."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_digest(c, echo=False):
    """Reads `c` until the peer's half-close, sending each piece back if `echo`:
    (sha256 hex digest, byte count)."""
    h, n = hashlib.sha256(), 0
    while True:
        d = c.recv(65536)
        if not d:
            return h.hexdigest(), n
        h.update(d)
        n += len(d)
        if echo:
            c.sendall(d)


def prefork(addr, port, workers, worker, logf):
    """A nonblocking IPv4 listener on addr:port and `workers` forked children, each running
    worker(listener, logf) (a child that returns from it exits 1): their pids."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(64)
    ls.setblocking(False)
    kids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            try:
                worker(ls, logf)
            finally:
                os._exit(1)
        kids.append(pid)
    return kids


def until_sigterm(kids):
    """The master's rest: on SIGTERM it stops `kids`, waits for them and exits 0. It wakes
    every 0.2 s to run the handler: the signal may land on a thread of the shim's, which
    would not end a pause() of this one."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    for k in kids:
        os.kill(k, signal.SIGTERM)
    for k in kids:
        os.waitpid(k, 0)
    sys.exit(0)
