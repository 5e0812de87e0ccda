#!/usr/bin/env python3
"""socketserver.ForkingTCPServer speaking the fork test protocol (examples/support/fork_proto.rs):
`E` echo with a sha256 trailer, `P` ping. Used by tests/rdma/fork_matrix.sh.

usage: forking_server.py ADDR PORT --log FILE [--pidfile F] [--max-conns K]

Serves K connections (default: until killed), each in a forked child, then waits for the
children (server_close) and exits 0 (a child's failure shows as an `error` line). The event log (O_APPEND, one
line per event) has `listen pid=P`, `serve pid=C ppid=P`, `served pid=C op=E up=N`,
`error pid=C ...`, `exit pid=P status=S`.
"""

import argparse
import os
import socketserver
import sys

from forklib import log_line, read_digest

args = None


def log(line):
    if args.log:
        log_line(args.log, line)


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        c = self.request
        c.settimeout(60)
        log(f"serve pid={os.getpid()} ppid={os.getppid()}")
        try:
            op = c.recv(1)
            if op == b"P":
                c.sendall(b"p")
                while c.recv(4096):
                    pass
                log(f"served pid={os.getpid()} op=P")
                return
            if op != b"E":
                raise ValueError(f"unknown operation byte {op!r}")
            d, n = read_digest(c, echo=True)
            c.sendall(f"digest up={d} n={n} down={d} m={n} pid={os.getpid()}\n".encode())
            log(f"served pid={os.getpid()} op=E up={n}")
        except Exception as e:  # logged, and the child exits 1 (ForkingMixIn: os._exit(1))
            log(f"error pid={os.getpid()} {type(e).__name__}: {e}")
            raise


class Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True
    block_on_close = True


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("--log")
    p.add_argument("--pidfile")
    p.add_argument("--max-conns", type=int)
    args = p.parse_args()
    srv = Server((args.addr, args.port), Handler)
    if args.pidfile:
        with open(args.pidfile + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.rename(args.pidfile + ".tmp", args.pidfile)
    log(f"listen pid={os.getpid()}")
    if args.max_conns is None:
        srv.serve_forever()
    for _ in range(args.max_conns):
        srv.handle_request()
    srv.server_close()  # waits for every child (block_on_close)
    log(f"exit pid={os.getpid()} status=0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
