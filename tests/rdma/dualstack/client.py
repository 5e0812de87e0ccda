#!/usr/bin/env python3
"""Echo client for tests/rdma/dualstack.sh.

usage: client.py FAMILY HOST PORT INFILE OUTFILE REPORT
  FAMILY  4 (AF_INET) or 6 (AF_INET6; HOST may be ::ffff:a.b.c.d)
Holds the connection open for a second (so that the test's QP sampler sees it), then sends
INFILE (while reading the echo into OUTFILE), shuts down its side and reads to EOF. Writes its raw getsockname/getpeername to REPORT as JSON. A refused connection exits 3
with "refused" on stderr.
"""

import json
import socket
import sys
import threading
import time

from names import names

fam, host, port, infile, outfile, report = sys.argv[1:7]
s = socket.socket(socket.AF_INET6 if fam == "6" else socket.AF_INET, socket.SOCK_STREAM)
try:
    s.connect((host, int(port)))
except ConnectionRefusedError:
    print("refused", file=sys.stderr)
    sys.exit(3)
rec = names(s)
time.sleep(1)
failed = []


def send():
    try:
        with open(infile, "rb") as f:
            while chunk := f.read(1 << 16):
                s.sendall(chunk)
        s.shutdown(socket.SHUT_WR)
    except OSError as e:
        failed.append(e)


t = threading.Thread(target=send)
t.start()
with open(outfile, "wb") as out:
    while b := s.recv(1 << 16):
        out.write(b)
t.join()
s.close()
with open(report, "w") as f:
    json.dump(rec, f)
if failed:
    print(f"send failed: {failed[0]}", file=sys.stderr)
    sys.exit(1)
