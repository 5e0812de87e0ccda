#!/usr/bin/env python3
"""A local attacker against rsock's control sockets (issue #21; docs/DESIGN.md, "Isolation
and threat model"). Run as another user, or as the same user without the victim's fds.

It finds every engine's abstract socket (`@rsock.<pid>.<nonce>` in /proc/net/unix) and:
  - replays requests (Relay, Accept, Take, Export) for guessed tokens — sequential around
    small numbers and random — proving "possession" with a socket of its own;
  - sends malformed messages: garbage, short, long, a wrong version, no fd, several fds;
  - floods: opens --flood connections per engine (every other one sends 4 fds of /dev/null
    and junk, the rest stay silent) and holds them for --hold seconds.

Prints one line per finding and a summary `local-attacker: names=N requests=R
got_fds=F answers_not_refused=A flood_held=H`; exit status 1 if any request got an fd or an
answer other than a refusal (what would be a breach), 0 otherwise.

`--squat PID` instead: waits for the engine of process PID to go (its name is free once
the process exits), binds that name itself and, for --hold seconds, answers every caller
as an owner would answer an accept: a forged "kernel TCP connection" carrying a socket of
its own. Prints `local-attacker: squat name=NAME callers=C`; what matters is that no caller
believes it (the caller checks the answering pid). `--found FILE` is created once the name
is known (the process may exit from then on).
"""
import argparse
import array
import os
import random
import socket
import struct
import sys
import time

MAGIC = b"RSCK"


def names():
    out = []
    with open("/proc/net/unix") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[-1].startswith("@rsock."):
                n = parts[-1][1:]
                if n not in out:
                    out.append(n)
    return out


def request(op, token, arg=0, pid=0, nonce=0):
    return MAGIC + bytes([1, op, 0, 0]) + struct.pack("<QQiIQ", token, arg, pid, 0, nonce)


def ask(name, payload, fds, timeout=0.5):
    """Sends payload with fds; returns (reply bytes or None, fds received)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(timeout)
    try:
        s.connect("\0" + name)
        s.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
        msg, anc, _flags, _addr = s.recvmsg(256, socket.CMSG_SPACE(64))
        got = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(data[: len(data) - len(data) % a.itemsize])
                got.extend(a)
        return msg, got
    except OSError:
        return None, []
    finally:
        s.close()


def refused(reply):
    # A refusal is kind 0 (Failed); no reply at all (closed) is a refusal too.
    return reply is None or len(reply) == 0 or (reply[:4] == MAGIC and reply[5] == 0)


def squat(pid, hold, ready, found):
    name = next((n for n in names() if n.startswith(f"rsock.{pid}.")), None)
    if name is None:
        print(f"local-attacker: no engine of pid {pid}", flush=True)
        return 2
    if found:
        open(found, "w").close()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    end = time.time() + 60
    while True:
        try:
            srv.bind("\0" + name)
            break
        except OSError:
            if time.time() > end:
                print(f"local-attacker: {name} never came free", flush=True)
                return 2
            time.sleep(0.01)
    srv.listen(64)
    srv.settimeout(0.2)
    print(f"local-attacker: squatting {name}", flush=True)
    if ready:
        open(ready, "w").close()
    forged = MAGIC + bytes([1, 2]) + bytes(98)  # Reply::Tcp, no addresses
    callers = 0
    end = time.time() + hold
    while time.time() < end:
        try:
            c, _ = srv.accept()
        except OSError:
            continue
        callers += 1
        bait = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            c.settimeout(0.5)
            c.recvmsg(256, socket.CMSG_SPACE(64))
            c.sendmsg([forged], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [bait.fileno()]))])
        except OSError:
            pass
        bait.close()
        c.close()
    print(f"local-attacker: squat name={name} callers={callers}", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64, help="tokens tried per engine and op")
    ap.add_argument("--flood", type=int, default=67, help="connections held open per engine")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds the flood is held")
    ap.add_argument("--ready", help="file created once the flood is open")
    ap.add_argument("--squat", type=int, help="squat this process's engine name once it exits")
    ap.add_argument("--found", help="--squat: file created once the engine's name is known")
    a = ap.parse_args()
    if a.squat:
        return squat(a.squat, a.hold, a.ready, a.found)

    found = names()
    print(f"local-attacker: uid={os.getuid()} engines: {' '.join(found) or 'none'}", flush=True)
    mine_a, mine_b = socket.socketpair()
    proof = mine_a.fileno()
    requests = got_fds = not_refused = 0

    def check(name, what, reply, fds):
        nonlocal requests, got_fds, not_refused
        requests += 1
        if fds:
            got_fds += len(fds)
            print(f"BREACH {name} {what}: received {len(fds)} fd(s)", flush=True)
            for fd in fds:
                os.close(fd)
        if not refused(reply):
            not_refused += 1
            print(f"BREACH {name} {what}: answered {reply[:8].hex() if reply else reply}", flush=True)

    rnd = random.Random(7)
    silent = 0
    for name in found:
        # An engine whose helper has not started (a prefork worker before its first
        # take-over) queues connections and answers nothing: no breach, nothing to attack.
        if ask(name, request(1, 0), [proof])[0] is None:
            silent += 1
            print(f"local-attacker: {name} does not answer (no helper yet)", flush=True)
            continue
        tokens = list(range(0, a.tokens // 2)) + [rnd.getrandbits(63) for _ in range(a.tokens // 2)]
        me = (os.getpid(), rnd.getrandbits(63))
        for t in tokens:
            for op, arg in ((1, 0), (2, 0), (3, 4791), (4, 0)):
                pid, nonce = me if op in (3, 4) else (0, 0)
                reply, fds = ask(name, request(op, t, arg, pid, nonce), [proof])
                check(name, f"op={op} token={t}", reply, fds)
        devnull = [os.open("/dev/null", os.O_RDONLY) for _ in range(4)]
        good = request(2, 1)
        for what, payload, fds in (
            ("garbage", b"let me in" * 3, [proof]),
            ("short", good[:20], [proof]),
            ("long", good * 3, [proof]),
            ("version", good[:4] + b"\x09" + good[5:], [proof]),
            ("no-fd", good, []),
            ("four-fds", good, devnull),
        ):
            reply, got = ask(name, payload, fds)
            check(name, what, reply, got)
        for fd in devnull:
            os.close(fd)

    # The flood: connections held open, half of them having sent fds and junk.
    held = []
    for name in found:
        for i in range(a.flood):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.setblocking(False)
            try:
                s.connect("\0" + name)
            except (BlockingIOError, OSError):
                s.close()
                continue
            if i % 2:
                fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(4)]
                try:
                    s.sendmsg([b"x" * 7], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                except OSError:
                    pass
                for fd in fds:
                    os.close(fd)
            held.append(s)
    print(f"local-attacker: flood of {len(held)} connections open", flush=True)
    if a.ready:
        open(a.ready, "w").close()
    time.sleep(a.hold)
    for s in held:
        s.close()
    print(
        f"local-attacker: names={len(found)} silent={silent} requests={requests} got_fds={got_fds} "
        f"answers_not_refused={not_refused} flood_held={len(held)}",
        flush=True,
    )
    return 1 if got_fds or not_refused else 0


if __name__ == "__main__":
    sys.exit(main())
