#!/usr/bin/env python3
"""Which process owned each RC QP seen during a cell (tests/rdma/fork_matrix.sh).

usage: qp_owners.py QPS_LOG --main PID --expect parent|child|any
                    [--server STATS_JSON]... [--client STATS_JSON]... [--min-server N] [--min-client N]

QPS_LOG is rdma_begin's sampler log (tests/lib/rdma_cells.sh): "@time" lines, each followed
by the `rdma resource show qp` lines of RC QPs at that time. The stats files are
`rsock stat --all --json` output of the server side and the client side: their pids name the
processes. Each QP (lqpn + pid) is printed with its role: client, server-parent (PID, the
process that accepted / the master) or server-child (another server-side process); a pid in
neither is "unknown".

Fails (exit 1, reasons on stdout) when: fewer than --min-server server-side or --min-client
client-side QPs were seen; a QP's owner is unknown; --expect parent and a server child owns
a QP; --expect child and the parent owns a QP.
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
    a = ap.parse_args()
    srv, cli = pids_of(a.server), pids_of(a.client)
    qps = {}  # (lqpn, pid) -> (comm, samples)
    try:
        for line in open(a.log):
            if line.startswith("@"):
                continue
            m = re.search(r"lqpn (\d+).*? pid (\d+) comm (\S+)(?:.* tgid (\d+))?", line)
            if not m:
                m2 = re.search(r"lqpn (\d+)", line)
                if m2:
                    k = (int(m2.group(1)), -1)
                    qps[k] = ("(kernel/no pid)", qps.get(k, ("", 0))[1] + 1)
                continue
            # `rdma` names the creating thread; the sampler adds its process (tgid).
            k = (int(m.group(1)), int(m.group(4) or m.group(2)))
            comm = m.group(3) + (f"(tid {m.group(2)})" if m.group(4) and m.group(4) != m.group(2) else "")
            qps[k] = (comm, qps.get(k, ("", 0))[1] + 1)
    except OSError:
        pass
    roles = {"client": 0, "server-parent": 0, "server-child": 0, "unknown": 0}
    for (lqpn, pid), (comm, n) in sorted(qps.items()):
        if pid in cli:
            role = "client"
        elif pid == a.main:
            role = "server-parent"
        elif pid in srv:
            role = "server-child"
        else:
            role = "unknown"
        roles[role] += 1
        print(f"qp lqpn={lqpn} pid={pid} comm={comm} role={role} samples={n}")
    print(f"qp owners: server parent (pid {a.main}) {roles['server-parent']}, server children "
          f"{roles['server-child']}, client {roles['client']}, unknown {roles['unknown']}; expected owner: {a.expect}")
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
    if a.expect == "child" and roles["server-parent"]:
        why.append(f"EXPECT_QP_OWNER=child but {roles['server-parent']} server QPs are owned by the parent (pid {a.main})")
    for w in why:
        print("FAIL " + w)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
