#!/usr/bin/env python3
"""Report of bench/rdma/profile.sh: user-space instructions per round trip, by library and
by function, from callgrind files of a SMALL and a LARGE run of each cell (their
difference is the per-round-trip cost, without start-up and connection set-up)."""
import os
import re
import sys
from collections import defaultdict

out = sys.argv[1]
runs = {}
conns = {}
syscalls = {}  # cell -> syscall -> per round trip
small = large = None
for line in open(f"{out}/runs.txt"):
    f = line.split()
    kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
    if f and f[0] == "run":
        runs[(kv["cell"], int(kv["n"]))] = kv["status"]
    elif f and f[0] == "conns":
        conns[kv["cell"]] = (kv.get("rdma", ""), kv.get("tcp", ""))
    elif f and f[0] == "sys":
        syscalls.setdefault(kv["cell"], {})[kv["syscall"]] = float(kv["per_rt"])
    elif f and f[0] == "rounds":
        small, large = int(kv["small"]), int(kv["large"])


def self_costs(path):
    """(object, function) -> self Ir, from a callgrind out file (name compression,
    call lines whose following cost line is inclusive and not the caller's own)."""
    names = {"ob": {}, "fn": {}}
    ob = fn = None
    costs = defaultdict(int)
    skip_next = False
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line)
        if m:
            kind, key, name = m.group(2), m.group(3), m.group(4)
            if name is not None:
                names[kind][key] = name
            if not m.group(1):  # ob=/fn= set the current context; cob=/cfn= name a callee
                if kind == "ob":
                    ob = names["ob"].get(key)
                else:
                    fn = names["fn"].get(key)
            continue
        if line.startswith("calls="):
            skip_next = True
            continue
        if line and (line[0].isdigit() or line[0] in "+-*"):
            parts = line.split()
            if skip_next:
                skip_next = False
                continue
            if len(parts) >= 2:
                costs[(ob, fn)] += int(parts[1])
    return costs


def short_ob(ob):
    b = os.path.basename(ob or "?")
    if b.startswith("librsock"):
        return "librsock.so"
    if b.startswith("libibverbs") or b.startswith("librxe") or "rdmav" in b:
        return "libibverbs + rxe provider"
    if b.startswith("librdmacm"):
        return "librdmacm"
    if b.startswith("libc.so"):
        return "libc"
    if b.startswith("ld-linux"):
        return "ld.so"
    if b in ("pingpong", "ib_send_lat"):
        return "program"
    if b.startswith("vgpreload"):
        return "valgrind"
    return "other"


def short_fn(fn):
    fn = re.sub(r"::h[0-9a-f]{16}$", "", fn or "?")
    return fn if len(fn) <= 90 else fn[:87] + "..."


cells = ["rsock", "rsock-epoll", "tcp-epoll", "send_lat_e"]
per_rt = {}
failed = []
for cell in cells:
    a, b = f"{out}/{cell}-{small}.cg", f"{out}/{cell}-{large}.cg"
    if runs.get((cell, small)) != "0" or runs.get((cell, large)) != "0" or not (os.path.exists(a) and os.path.exists(b)):
        failed.append(f"{cell}: a run failed or left no profile")
        continue
    ca, cb = self_costs(a), self_costs(b)
    per_rt[cell] = {k: (cb.get(k, 0) - ca.get(k, 0)) / (large - small) for k in set(ca) | set(cb)}
for cell, (rd, tcp) in conns.items():
    if rd in ("", "0") or tcp != "0":
        failed.append(f"{cell}: not over RDMA (rdma={rd} tcp={tcp})")

groups = ["librsock.so", "libibverbs + rxe provider", "librdmacm", "libc", "program", "ld.so", "other"]
print("# Where a round trip's user-space instructions go (callgrind)\n")
print(f"Client side of a {open(f'{out}/runs.txt').read().split('size=')[-1].split()[0]} B ping-pong "
      f"in one guest over rxe0; instructions of one round trip = (run of {large} − run of {small}) "
      f"/ {large - small}, so start-up and set-up are not in them. Waits do not poll "
      "(`RSOCK_SPIN_US=0`). Kernel work (syscalls, Soft-RoCE itself) is not counted here: see "
      "the CPU table of the two-host bench.\n")
print("| per round trip | " + " | ".join(groups) + " | total |")
print("|---|" + "---:|" * (len(groups) + 1))
for cell, costs in per_rt.items():
    by = defaultdict(float)
    for (ob, _), v in costs.items():
        by[short_ob(ob)] += v
    print(f"| {cell} | " + " | ".join(f"{round(by[g]) + 0:,}" for g in groups) + f" | **{sum(by.values()):,.0f}** |")
for cell in ("rsock-epoll", "rsock"):
    if cell not in per_rt:
        continue
    print(f"\n## {cell}: the 20 costliest functions per round trip (self instructions)\n")
    print("| instructions | library | function |")
    print("|---:|---|---|")
    top = sorted(per_rt[cell].items(), key=lambda kv: -kv[1])[:20]
    for (ob, fn), v in top:
        print(f"| {v:,.0f} | {short_ob(ob)} | `{short_fn(fn)}` |")
if syscalls:
    cols = sorted(syscalls)
    print("\n## Syscalls per round trip, epoll-driven client (strace -f, all threads, no polling)\n")
    print("`rsock-epoll-base`: the shim of the baseline commit given to bench/rdma/profile.sh.\n")
    print("| syscall | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    names = sorted({k for c in cols for k in syscalls[c] if k != "ALL"}, key=lambda k: -max(syscalls[c].get(k, 0) for c in cols))
    for k in names + ["ALL"]:
        print(f"| {k if k != 'ALL' else '**all**'} | " + " | ".join(f"{syscalls[c].get(k, 0):.2f}" for c in cols) + " |")
for f in failed:
    print(f"\nFAILED: {f}")
