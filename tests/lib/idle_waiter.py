"""An idle waiter (tests/lib/rdma_cells.sh, idle_waiters): exchanges one message with an echo
server, prints "ready", then waits on its silent connection until killed.

    python3 idle_waiter.py ADDR PORT recv|epoll|poll
"""
import select
import socket
import sys

s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"ping")
got = b""
while len(got) < 4:
    got += s.recv(4 - len(got))
assert got == b"ping", got
print("ready", flush=True)
m = sys.argv[3]
if m == "recv":
    s.recv(1)
elif m == "epoll":
    e = select.epoll()
    e.register(s.fileno(), select.EPOLLIN)
    e.poll()
else:
    p = select.poll()
    p.register(s.fileno(), select.POLLIN)
    p.poll()
