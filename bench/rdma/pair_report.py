#!/usr/bin/env python3
"""Report of bench/rdma/pair.sh: medians over rounds and ratios within the boot."""
import statistics
import sys
from collections import defaultdict

out = sys.argv[1]
host = dict(line.rstrip("\n").split("=", 1) for line in open(f"{out}/host.txt") if "=" in line)
lat = defaultdict(list)   # (cell, size) -> medians per round
p99 = defaultdict(list)
csw = defaultdict(list)
pkts = defaultdict(list)  # cell -> (sent per rt) per round
failed = []
rps = defaultdict(dict)   # what -> cell -> (value, extra)
cpu = defaultdict(list)   # (cell, what without the round) -> [(n0u, n0k, n1u, n1k) µs per unit]
cpu_raw = []              # (key, units, secs, ticks) as measured
idle = None               # each node's ticks per second with nothing measured
TICK_US = 10_000          # USER_HZ = 100
for line in open(f"{out}/data.txt"):
    f = line.split()
    if not f:
        continue
    kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
    if f[0] == "lat":
        try:
            key = (kv["cell"], int(kv["size"]))
            lat[key].append(float(kv["median_us"]))
            p99[key].append(float(kv["p99_us"]))
            if "srv_csw_rt" in kv:
                csw[key].append(float(kv["cli_csw_rt"]) + float(kv["srv_csw_rt"]))
        except (KeyError, ValueError):
            failed.append(f"unreadable: {line.strip()}")
    elif f[0] == "pkts":
        rts = int(kv["rts"])
        if rts > 0:
            pkts[kv["cell"]].append(int(kv["sent"]) / rts)
    elif f[0] == "rps":
        try:
            rps[kv["what"]][kv["cell"]] = (float(kv["value"]), kv.get("p99") or kv.get("lat_avg_ms") or kv.get("p50", ""))
        except (KeyError, ValueError):
            failed.append(f"server cell without a figure: {line.strip()}")
    elif f[0] == "cpu":
        try:
            units, secs = int(kv["units"]), float(kv.get("secs", "0"))
            ticks = [int(kv[k]) for k in ("n0u", "n0k", "n1u", "n1k")]
            if kv["cell"] == "idle":
                idle = [t / secs for t in ticks] if secs > 0 else None
            elif units > 0:
                what = kv["what"].split("-r")[0] if kv["what"].startswith("pingpong") else kv["what"]
                cpu_raw.append(((kv["cell"], what), units, secs, ticks))
        except (KeyError, ValueError):
            failed.append(f"unreadable: {line.strip()}")
    elif f[0] == "conns":
        if kv.get("rdma", "") in ("", "0") or kv.get("tcp", "1") != "0":
            failed.append(f"{kv['cell']} round {kv['round']}: not over RDMA (rdma={kv.get('rdma')} tcp={kv.get('tcp')})")

# CPU of a measurement net of what the nodes spend anyway (their idle rate times its length).
for key, units, secs, ticks in cpu_raw:
    base = [r * secs for r in idle] if idle else [0] * 4
    cpu[key].append(tuple(max(t - b, 0) * TICK_US / units for t, b in zip(ticks, base)))

med = lambda v: statistics.median(v) if v else None
fmt = lambda v: "—" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.2f}")
ratio = lambda a, b: "—" if a is None or b is None else f"{a / b:.2f}×"

print("# Two-host latency: rsock, kernel TCP and raw verbs across one emulated wire\n")
print(f"{host.get('date_utc', '')}, commit {host.get('commit', '?')}, host {host.get('host_cpu', '?')}; "
      "two TCG guests (2 vCPUs each) joined by a Unix-datagram wire, each with its own rxe0. "
      "Round-trip times in µs (perftest's half round trips doubled), medians of the rounds' "
      f"medians ({len(next(iter(lat.values()), []))} rounds). Compare ratios, not µs.\n")
print("| round trip | rsock | kernel TCP | `ib_write_lat` | `ib_send_lat -e` | rsock/TCP | rsock/write_lat | rsock/send_lat -e |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for size in (64, 4096):
    for mode, rs, tcp in (("blocking", "rsock", "tcp"), ("blocking, `RSOCK_SPIN_US=0`", "rsock-nospin", "tcp"),
                          ("epoll-driven", "rsock-epoll", "tcp-epoll")):
        a, t = med(lat[(rs, size)]), med(lat[(tcp, size)])
        w, e = med(lat[("write_lat", size)]), med(lat[("send_lat_e", size)])
        print(f"| {size} B, {mode}, p50 | **{fmt(a)}** | {fmt(t)} | {fmt(w)} | {fmt(e)} | {ratio(a, t)} | {ratio(a, w)} | {ratio(a, e)} |")
    a, t = med(p99[("rsock", size)]), med(p99[("tcp", size)])
    print(f"| {size} B, blocking, p99 | {fmt(a)} | {fmt(t)} | | | {ratio(a, t)} | | |")
print()
print("| per round trip (64 B and 4 KiB runs together) | rsock | rsock, no spin | rsock, epoll | `ib_write_lat` |")
print("|---|---:|---:|---:|---:|")
print(f"| packets sent by node 0's rxe0 | {fmt(med(pkts['rsock']))} | {fmt(med(pkts['rsock-nospin']))} | {fmt(med(pkts['rsock-epoll']))} | {fmt(med(pkts['write_lat']))} |")
print(f"| context switches, both ends, 64 B | {fmt(med(csw[('rsock', 64)]))} | {fmt(med(csw[('rsock-nospin', 64)]))} | {fmt(med(csw[('rsock-epoll', 64)]))} | |")
if rps:
    print("\n## Real servers across the wire (one run each)\n")
    print("| server, load | rsock | kernel TCP | rsock/TCP | latency rsock / TCP |")
    print("|---|---:|---:|---:|---:|")
    names = {"wrk-4k": "nginx 2 workers, `wrk -t 2 -c 8`, 4 KiB (req/s)", "wrk-64k": "nginx, 64 KiB (req/s)",
             "pgbench-select-only": "PostgreSQL `pgbench -S -c 4 -j 2` (tps)", "pgbench-tpcb": "PostgreSQL `pgbench -c 4 -j 2`, TPC-B (tps)",
             "redis-set": "Redis `redis-benchmark -c 8 -t set` (req/s)", "redis-get": "Redis, GET (req/s)",
             "memcached-set": "memcached `memcslap --concurrency 8 --test set` (ops/s)", "memcached-get": "memcached, get (ops/s)"}
    for what, cells in rps.items():
        a, t = cells.get("rsock"), cells.get("tcp")
        unit = " (p99)" if what.startswith("wrk") else " ms (mean)" if what.startswith("pg") else " ms (p50)"
        lat = "" if what.startswith("memcached") else f"{a[1] if a else '?'} / {t[1] if t else '?'}{unit}"
        print(f"| {names.get(what, what)} | **{fmt(a and a[0])}** | {fmt(t and t[0])} | {ratio(a and a[0], t and t[0])} | {lat} |")
if cpu:
    def cpu_of(cell, what):
        """Medians over rounds of (node 0 user, kernel, node 1 user, kernel), µs per unit."""
        v = cpu.get((cell, what))
        return None if not v else tuple(statistics.median(x[i] for x in v) for i in range(4))
    total = lambda c: None if c is None else sum(c)
    cell_fmt = lambda c: "—" if c is None else f"{c[0] + c[1]:,.0f} ({c[1]:,.0f})"
    print("\n## CPU per round trip and per request, both nodes\n")
    print("Each node's whole CPU time (/proc/stat: user + kernel; kernel = system + irq + softirq, "
          "where Soft-RoCE does its work), over a measurement, less what that node spends with "
          "nothing measured (" + (", ".join(f"{r * TICK_US / 1e6:.0%}" for r in (idle[0] + idle[1], idle[2] + idle[3])) + " of a CPU on node 0 and node 1" if idle else "not measured") +
          " per second of the measurement), divided by its round trips or "
          "requests: µs of CPU, kernel part in brackets. Ping-pong cells include the process's "
          "start and connection set-up, spread over their round trips (64 B and 4 KiB together). "
          "`ib_write_lat` polls by design: both its ends stay busy.\n")
    print("| ping-pong, per round trip | node 0 (client) | node 1 (server) | both | vs kernel TCP |")
    print("|---|---:|---:|---:|---:|")
    tcp_pp = {"rsock": "tcp", "rsock-nospin": "tcp", "rsock-epoll": "tcp-epoll"}
    for cell in ("rsock", "rsock-nospin", "rsock-epoll", "tcp", "tcp-epoll", "send_lat_e", "write_lat"):
        c = cpu_of(cell, "pingpong")
        if c is None:
            continue
        t = cpu_of(tcp_pp.get(cell, ""), "pingpong")
        print(f"| {cell} | {cell_fmt(c[:2])} | {cell_fmt(c[2:])} | **{total(c):,.0f}** | {ratio(total(c), total(t))} |")
    whats = sorted({w for (_, w) in cpu if w != "pingpong"})
    if whats:
        print("\n| server, per request | rsock: client node | rsock: server node | rsock, both | TCP, both | rsock/TCP |")
        print("|---|---:|---:|---:|---:|---:|")
        for what in whats:
            a, t = cpu_of("rsock", what), cpu_of("tcp", what)
            print(f"| {what} | {cell_fmt(a and a[:2])} | {cell_fmt(a and a[2:])} | **{fmt(total(a))}** | {fmt(total(t))} ({fmt(t and t[1] + t[3])}) | {ratio(total(a), total(t))} |")
print(f"\nRaw data: bench/rdma/results/pair-raw/data.txt.")
for f in failed:
    print(f"\nFAILED: {f}")
