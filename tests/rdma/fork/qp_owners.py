#!/usr/bin/env python3
"""Which process owned each RC QP seen during a cell (tests/rdma/fork_matrix.sh).

usage: qp_owners.py QPS_LOG --main PID --expect parent|child|any [--parent-grace N]
                    [--server STATS_JSON]... [--client STATS_JSON]... [--min-server N] [--min-client N]

QPS_LOG is rdma_begin's sampler log (tests/lib/rdma_cells.sh): "@time" lines, each followed
by the `rdma resource show qp` lines of RC QPs at that time. The stats files are
`rsock stat --all --json` output of the server side and the client side: their pids name the
processes. Each QP (lqpn + pid) is printed with its role: client, server-parent (PID, the
process that accepted / the master) or server-child (another server-side process); a pid in
neither is "unknown".

Fails (exit 1, reasons on stdout) when: fewer than --min-server server-side or --min-client
client-side QPs were seen; a QP's owner is a process of neither side (its parent chain, from the samples, is
followed: an exec'd program without stats counts as a server child); --expect parent and a server child owns
a QP; --expect child and a QP of the parent lingers, or fewer server-child QPs than
--min-server. A connection the parent accepted is its own until the child that serves it
takes it over, and the parent's QP goes with the hand-over; it lingers if it was seen in
more than --parent-grace samples AND was still there in the last sample that shows a
child's QP. Either alone depends on speed: a slow machine takes more samples to hand over
(CI's took more than 4 of 0.3 s), and short connections leave few child samples (an nginx
cell's children were seen in one sample only, together with a parent QP being handed over).
"""

import argparse
import json
import re
import sys


def pids_of(paths):
    out = {}
    for p in paths:
        try:
            for line in open(p):
                line = line.strip()
                if line:
                    j = json.loads(line)
                    out[j["pid"]] = j.get("comm", "")
        except (OSError, ValueError):
            pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--main", type=int, required=True)
    ap.add_argument("--expect", choices=["parent", "child", "any"], default="any")
    ap.add_argument("--server", action="append", default=[])
    ap.add_argument("--client", action="append", default=[])
    ap.add_argument("--min-server", type=int, default=1)
    ap.add_argument("--min-client", type=int, default=1)
    ap.add_argument("--parent-grace", type=int, default=0)
    a = ap.parse_args()
    srv, cli = pids_of(a.server), pids_of(a.client)
    # Lines: "... lqpn N ... [pid TID comm C] ... tgid G ppid P" (the sampler adds tgid/ppid
    # while the thread exists, "?" after). A QP whose creating thread has gone is listed
    # without pid: it keeps the owner seen in other samples of the same lqpn.
    samples = []  # (lqpn, tid, comm, sample number)
    tid2tgid, parent = {}, {}
    nsample = 0
    try:
        for line in open(a.log):
            if line.startswith("@"):
                nsample += 1
                continue
            m = re.search(r"lqpn (\d+)", line)
            if not m:
                continue
            lqpn = int(m.group(1))
            m = re.search(r" pid (\d+) comm (\S+)", line)
            tid, comm = (int(m.group(1)), m.group(2)) if m else (None, None)
            g = re.search(r" tgid (\d+)", line)
            pp = re.search(r" ppid (\d+)", line)
            if tid is not None and g:
                tid2tgid[tid] = int(g.group(1))
                if pp:
                    parent[int(g.group(1))] = int(pp.group(1))
            samples.append((lqpn, tid, comm, nsample))
    except OSError:
        pass

    def role(pid):
        seen = 0
        while pid is not None and seen < 32:
            if pid in cli:
                return "client"
            if pid == a.main:
                return "server-parent" if seen == 0 else "server-child"
            if pid in srv:
                return "server-child"
            pid, seen = parent.get(pid), seen + 1
        return "unknown"

    # A thread that had already exited when it was sampled ("tgid ?") and is never seen alive
    # names no process: its QP is as unattributed as one listed without a pid (a process
    # tearing down at exit, e.g. a short-lived client).
    samples = [(q, t if t is None or t in tid2tgid else None, c, i) for q, t, c, i in samples]
    qps = {}  # (lqpn, owner or None) -> [comm, samples, last sample number]
    owners = {}  # lqpn -> owners seen
    for lqpn, tid, comm, _ in samples:
        if tid is not None:
            owners.setdefault(lqpn, set()).add(tid2tgid.get(tid, tid))
    for lqpn, tid, comm, i in samples:
        if tid is None:
            known = owners.get(lqpn, set())
            owner = next(iter(known)) if len(known) == 1 else None
            comm = "(no pid listed)"
        else:
            owner = tid2tgid.get(tid, tid)
            if owner != tid:
                comm = f"{comm}(tid {tid})"
        e = qps.setdefault((lqpn, owner), [comm, 0, i])
        if e[0] == "(no pid listed)":
            e[0] = comm
        e[1] += 1
        e[2] = max(e[2], i)
    roles = {"client": 0, "server-parent": 0, "server-child": 0, "unknown": 0, "unattributed": 0}
    counted = [(lqpn, pid, comm, n, last, role(pid) if pid is not None else "unattributed")
               for (lqpn, pid), (comm, n, last) in qps.items()
               if pid is not None or not owners.get(lqpn)]  # ownerless samples of an owned QP count there
    counted.sort(key=lambda q: (q[0], q[1] or 0))
    last_child = max((q[4] for q in counted if q[5] == "server-child"), default=0)
    lingering = 0  # parent QPs past the grace and still there when the children's last were
    for lqpn, pid, comm, n, last, r in counted:
        roles[r] += 1
        if r == "server-parent" and n > a.parent_grace and last >= last_child:
            lingering += 1
        print(f"qp lqpn={lqpn} pid={pid if pid is not None else '?'} comm={comm} role={r} "
              f"samples={n} last={last}")
    print(f"qp owners: server parent (pid {a.main}) {roles['server-parent']}, server children "
          f"{roles['server-child']}, client {roles['client']}, unknown {roles['unknown']}, "
          f"unattributed {roles['unattributed']} (creating thread gone before any sample); expected owner: {a.expect}")
    why = []
    nsrv = roles["server-parent"] + roles["server-child"]
    if nsrv < a.min_server:
        why.append(f"{nsrv} server-side QPs seen, want >= {a.min_server}")
    if roles["client"] < a.min_client:
        why.append(f"{roles['client']} client QPs seen, want >= {a.min_client}")
    if roles["unknown"]:
        why.append(f"{roles['unknown']} QPs owned by a process that is neither side's")
    if a.expect == "parent" and roles["server-child"]:
        why.append(f"EXPECT_QP_OWNER=parent but {roles['server-child']} server QPs are owned by children")
    if a.expect == "child" and lingering:
        why.append(f"EXPECT_QP_OWNER=child but {lingering} server QPs of the parent (pid {a.main}) "
                   f"were seen in more than {a.parent_grace} samples and outlived the children's "
                   f"QPs (last seen in sample {last_child})")
    if a.expect == "child" and roles["server-child"] < a.min_server:
        why.append(f"EXPECT_QP_OWNER=child but only {roles['server-child']} server QPs are children's")
    for w in why:
        print("FAIL " + w)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
