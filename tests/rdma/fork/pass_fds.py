#!/usr/bin/env python3
"""An acceptor that hands each accepted connection to an unrelated worker process over a
unix socket (SCM_RIGHTS), as acceptor/worker servers, Node.js cluster and systemd do.

  pass_fds.py worker UNIX_PATH N LOG     serves N connections it is sent: echoes until EOF
  pass_fds.py acceptor ADDR PORT UNIX_PATH N LOG
                                         accepts N connections, sends each to the worker,
                                         closes its own copy at once
  pass_fds.py client ADDR PORT FILE OUT PAUSE_MS
                                         sends FILE (pausing PAUSE_MS half-way, connection
                                         open), shuts down writing, writes what came back
                                         to OUT

  pass_fds.py lsender ADDR PORT UNIX_PATH LOG HOLD_S [GATE]
                                         listens, sends the listener itself to the worker,
                                         closes its copy, and exits after HOLD_S seconds
                                         (a seamless reload's old process) — with GATE, no
                                         sooner than the file GATE exists (at most 60 s)
  pass_fds.py lworker UNIX_PATH N LOG [GATE]
                                         accepts and serves N connections on the listener
                                         it is sent (once the file GATE exists, if given)
  pass_fds.py spawner ADDR PORT K N LOG  listens, then forks K children that each exec
                                         `pass_fds.py execaccept 3 N LOG` with the listener on
                                         fd 3 and an environment cleaned of everything but
                                         PATH (Postfix's master does both); never accepts
  pass_fds.py forkexec ADDR PORT N LOG   accepts N connections; a fork child per connection
                                         reads (and echoes) its first byte, then execs
                                         `pass_fds.py fdecho 3 I LOG` with the connection
                                         on fd 3

The worker is started on its own (not forked by the acceptor). LOG gets `listen pid=P`,
`passed pid=P conn=I`, `serve pid=W conn=I`, `served pid=W conn=I bytes=B` lines.
"""
import os
import socket
import sys
import threading


def log(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def echo(conn, i, logpath):
    n = 0
    with conn:
        while True:
            b = conn.recv(65536)
            if not b:
                break
            conn.sendall(b)
            n += len(b)
        conn.shutdown(socket.SHUT_WR)
    log(logpath, f"served pid={os.getpid()} conn={i} bytes={n}")


def serve_each(next_conn, n, logpath):
    """Echoes n connections, each on a thread: next_conn() gives the next one."""
    threads = []
    for i in range(n):
        conn = next_conn()
        log(logpath, f"serve pid={os.getpid()} conn={i} peer={conn.getpeername()}")
        t = threading.Thread(target=echo, args=(conn, i, logpath))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def channel(path):
    """The unix socket the sender connects to at path: bound, listened, accepted."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    return srv.accept()[0]


def received_socket(ch):
    _msg, fds, _flags, _addr = socket.recv_fds(ch, 16, 1)
    return socket.socket(fileno=fds[0])


def worker(path, n, logpath):
    ch = channel(path)
    serve_each(lambda: received_socket(ch), n, logpath)


def acceptor(addr, port, path, n, logpath):
    lst = socket.create_server((addr, port))
    log(logpath, f"listen pid={os.getpid()}")
    ch = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ch.connect(path)
    for i in range(n):
        conn, _peer = lst.accept()
        socket.send_fds(ch, [b"c"], [conn.fileno()])
        conn.close()  # the worker holds it now
        log(logpath, f"passed pid={os.getpid()} conn={i}")
    ch.close()


def lworker(path, n, logpath, gate=None):
    import time
    lst = received_socket(channel(path))
    log(logpath, f"received pid={os.getpid()} name={lst.getsockname()}")
    while gate and not os.path.exists(gate):
        time.sleep(0.05)
    serve_each(lambda: lst.accept()[0], n, logpath)


def lsender(addr, port, path, logpath, hold_s, gate=None):
    import time
    lst = socket.create_server((addr, port))
    log(logpath, f"listen pid={os.getpid()}")
    ch = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ch.connect(path)
    socket.send_fds(ch, [b"l"], [lst.fileno()])
    lst.close()
    ch.close()
    log(logpath, f"passed pid={os.getpid()} listener")
    time.sleep(hold_s)
    end = time.time() + 60
    while gate and not os.path.exists(gate) and time.time() < end:
        time.sleep(0.05)
    log(logpath, f"exit pid={os.getpid()}")


def forkexec(addr, port, n, logpath):
    lst = socket.create_server((addr, port))
    log(logpath, f"listen pid={os.getpid()}")
    kids = []
    for i in range(n):
        conn, _peer = lst.accept()
        pid = os.fork()
        if pid == 0:
            lst.close()
            first = conn.recv(1)  # the child takes the connection over here
            conn.sendall(first)
            os.dup2(conn.fileno(), 3)  # inheritable, not close-on-exec
            os.execv(sys.executable, [sys.executable, __file__, "fdecho", "3", str(i), logpath])
        conn.close()
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)


def spawner(addr, port, k, n, logpath):
    lst = socket.create_server((addr, port))
    lst.set_inheritable(True)
    log(logpath, f"listen pid={os.getpid()}")
    kids = []
    for _ in range(k):
        pid = os.fork()
        if pid == 0:
            os.dup2(lst.fileno(), 3)
            os.execve(sys.executable, [sys.executable, __file__, "execaccept", "3", str(n), logpath],
                      {"PATH": "/usr/bin:/bin"})
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)


def execaccept(fd, n, logpath):
    lst = socket.socket(fileno=fd)
    log(logpath, f"accepting pid={os.getpid()} name={lst.getsockname()}")
    serve_each(lambda: lst.accept()[0], n, logpath)


def fdecho(fd, i, logpath):
    conn = socket.socket(fileno=fd)
    log(logpath, f"serve pid={os.getpid()} conn={i}")
    echo(conn, i, logpath)


def client(addr, port, path, out, pause_ms):
    import time
    data = open(path, "rb").read()
    c = socket.create_connection((addr, port))
    got = bytearray()

    def reader():
        while True:
            b = c.recv(65536)
            if not b:
                break
            got.extend(b)

    t = threading.Thread(target=reader)
    t.start()
    half = len(data) // 2
    c.sendall(data[:half])
    time.sleep(pause_ms / 1000)
    c.sendall(data[half:])
    c.shutdown(socket.SHUT_WR)
    t.join()
    c.close()
    open(out, "wb").write(got)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]))
    elif sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "lworker":
        lworker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    elif sys.argv[1] == "lsender":
        gate = sys.argv[7] if len(sys.argv) > 7 else None
        lsender(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], float(sys.argv[6]), gate)
    elif sys.argv[1] == "forkexec":
        forkexec(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif sys.argv[1] == "spawner":
        spawner(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif sys.argv[1] == "execaccept":
        execaccept(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "fdecho":
        fdecho(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        acceptor(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
