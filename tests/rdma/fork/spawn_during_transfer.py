#!/usr/bin/env python3
"""While an echo transfer runs on a live connection in this process (echo_client.transfer:
a writer thread sends, the main thread reads the echo), the writer thread starts children
the ways real programs do; the transfer must stay intact (sha256 both ways). Used by
tests/rdma/fork_matrix.sh, cell subprocess_during_transfer.

usage: spawn_during_transfer.py ADDR PORT FILE

Actions, one after each of the first chunks (each child's outcome is checked too):
  run_true         subprocess.run(["/bin/true"])           (CPython: vfork + exec)
  run_missing      subprocess.run(["/nonexistent"])        (exec fails in the vfork child,
                                                            which _exits; FileNotFoundError)
  posix_spawn      os.posix_spawn("/bin/true")
  posix_spawnp     os.posix_spawnp("true")
  run_preexec      subprocess.run([...], preexec_fn=...)   (forces fork + exec)
  pass_fd          subprocess.run(["/bin/sh", "-c", "exit 0"], pass_fds=[sock fd]): the exec'd
                   child inherits the connection's fd and exits (closing its copy)
  system           os.system("true")                       (glibc system: posix_spawn)
  fork_exit        os.fork(); the child calls os._exit(0)  (no atexit)
  fork_sys_exit    os.fork(); the child returns through sys.exit(0) (atexit, libc exit)
Prints `action NAME ok` lines, then the transfer's result line; exit 0 only if every
action behaved and the transfer checked out.
"""

import hashlib
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from echo_client import transfer  # noqa: E402

results = []
conn_fd = [None]


def wait_child(pid):
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st)


def act(name):
    try:
        if name == "run_true":
            rc = subprocess.run(["/bin/true"]).returncode
            assert rc == 0, f"status {rc}"
        elif name == "run_missing":
            try:
                subprocess.run(["/nonexistent"])
                raise AssertionError("no FileNotFoundError")
            except FileNotFoundError:
                pass
        elif name == "posix_spawn":
            rc = wait_child(os.posix_spawn("/bin/true", ["true"], os.environ))
            assert rc == 0, f"status {rc}"
        elif name == "posix_spawnp":
            rc = wait_child(os.posix_spawnp("true", ["true"], os.environ))
            assert rc == 0, f"status {rc}"
        elif name == "run_preexec":
            rc = subprocess.run(["/bin/true"], preexec_fn=lambda: None).returncode
            assert rc == 0, f"status {rc}"
        elif name == "pass_fd":
            fd = conn_fd[0]
            os.set_inheritable(fd, True)
            try:
                rc = subprocess.run(["/bin/sh", "-c", "exit 0"], pass_fds=[fd]).returncode
            finally:
                os.set_inheritable(fd, False)
            assert rc == 0, f"status {rc}"
        elif name == "system":
            rc = os.waitstatus_to_exitcode(os.system("true"))
            assert rc == 0, f"status {rc}"
        elif name in ("fork_exit", "fork_sys_exit"):
            pid = os.fork()
            if pid == 0:
                if name == "fork_exit":
                    os._exit(0)
                sys.stdout.flush()
                sys.exit(0)  # SystemExit -> interpreter shutdown -> exit(0): atexit runs
            rc = wait_child(pid)
            assert rc == 0, f"status {rc}"
        else:
            raise AssertionError("unknown action")
        results.append((name, "ok"))
    except Exception as e:
        results.append((name, f"FAIL {type(e).__name__}: {e}"))


ACTIONS = ["run_true", "run_missing", "posix_spawn", "posix_spawnp", "run_preexec", "pass_fd",
           "system", "fork_exit", "fork_sys_exit"]


def main():
    addr, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    payload = open(path, "rb").read()
    me = os.getpid()

    def between(k):
        if os.getpid() != me:  # never in a forked child (it leaves through sys.exit)
            return
        if k < len(ACTIONS):
            act(ACTIONS[k])

    import socket as _s
    orig = _s.create_connection

    def remember(*a, **kw):  # the fd of the live connection, for pass_fd
        c = orig(*a, **kw)
        conn_fd[0] = c.fileno()
        return c

    _s.create_connection = remember
    bad = 0
    try:
        # The pause (after the actions, at half the payload) keeps the connection open
        # long enough for the test's QP sampler to see both ends.
        pid, tx, rx = transfer(addr, port, payload, between=between, pause_ms=2000)
        line = f"ok 1/1 connections tx={tx} rx={rx} pids={pid} up_sha={hashlib.sha256(payload).hexdigest()}"
    except Exception as e:
        line = f"FAILED 1/1 connections: {type(e).__name__}: {e}"
        bad += 1
    if os.getpid() != me:
        os._exit(0)
    for name, r in results:
        print(f"action {name} {r}")
        bad += r != "ok"
    missing = [a for a in ACTIONS if a not in {n for n, _ in results}]
    if missing:
        print(f"actions not run (payload too small?): {' '.join(missing)}")
        bad += 1
    print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
