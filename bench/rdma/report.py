#!/usr/bin/env python3
"""Turns bench/rdma/guest.sh's data.txt (plus env.txt, host.txt) into report.md and
latency.dat (for bench/rdma/latency.gp). Usage: report.py DIR"""
import statistics
import sys
from collections import defaultdict
from pathlib import Path

d = Path(sys.argv[1])
recs = []
for line in (d / "data.txt").read_text().splitlines():
    kind, _, rest = line.partition(" ")
    if kind in ("note", "fail"):
        what, _, text = rest.partition(" text=")
        recs.append({"kind": kind, "what": what.removeprefix("what="), "text": text})
        continue
    r = {"kind": kind}
    for kv in rest.split():
        k, _, v = kv.partition("=")
        r[k] = v
    recs.append(r)


def kv_file(name):
    out = {}
    p = d / name
    if p.exists():
        for line in p.read_text().splitlines():
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


env, host = kv_file("env.txt"), kv_file("host.txt")


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


# (kind, path, size) -> {field: [values over runs]}
series = defaultdict(lambda: defaultdict(list))
for r in recs:
    if r["kind"] in ("lat", "bw"):
        key = (r["kind"], r["path"], r["size"])
        for f in ("median_us", "p99_us", "mean_us", "mbps", "cpu_us_rt", "csw_rt", "cpu_s_gb"):
            v = num(r.get(f))
            if v is not None:
                series[key][f].append(v)


def med(kind, path, size, field):
    v = series.get((kind, path, str(size)), {}).get(field)
    return statistics.median(v) if v else None


def lo(kind, path, size, field):
    v = series.get((kind, path, str(size)), {}).get(field)
    return min(v) if v else None


def hi(kind, path, size, field):
    v = series.get((kind, path, str(size)), {}).get(field)
    return max(v) if v else None


def nruns(kind, path, size, field):
    return len(series.get((kind, path, str(size)), {}).get(field, []))


def f(x, nd=1):
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}×"


def hsize(s):
    s = int(s)
    if s >= 1024 and s % 1024 == 0:
        return f"{s // 1024} KiB"
    return f"{s} B"


lat_sizes = sorted({int(k[2]) for k in series if k[0] == "lat"})
bw_sizes = sorted({int(k[2]) for k in series if k[0] == "bw" and k[2].isdigit() and k[1] in ("verbs", "rsocket")})
# rsocket's latency: pingpong under librspreload (same program as rsock and TCP) where it
# worked, else rstream (mean only).
rsp_ok = any(k[1] == "rspreload" for k in series)


def rsocket_lat(size, field):
    if rsp_ok and med("lat", "rspreload", size, field) is not None:
        return med("lat", "rspreload", size, field)
    if field in ("median_us",):
        return med("lat", "rstream", size, "mean_us")
    return None


out = []
w = out.append
smoke = env.get("smoke", "0") == "1"
w(f"# rsock RDMA benchmark — {'SMOKE (not figures to quote)' if smoke else 'results'}")
w("")
w(f"Run: {host.get('date_utc', '?')}, commit {host.get('commit', '?')}, "
  f"{env.get('runs', '?')} run(s) of each measurement, one boot of the Soft-RoCE test bed "
  f"(`bench/rdma/run.sh`, see [docs/BENCHMARKS.md](../../../docs/BENCHMARKS.md)).")
w("")
w("Machine: host " + host.get("host_cpu", "?") + f", {host.get('host_cpus', '?')} CPUs, "
  f"kernel {host.get('host_kernel', '?')}, load average {host.get('host_load_before', '?')} before / "
  f"{host.get('host_load_after', '?')} after (other work shares the host). Guest: "
  f"{host.get('qemu', '?')} TCG (no KVM), {env.get('guest_cpus', '?')} vCPUs, {env.get('guest_mem_mb', '?')} MiB, "
  f"kernel {env.get('guest_kernel', '?')}, clocksource {env.get('clocksource', '?')}; rxe0 (Soft-RoCE) on veth0 "
  f"MTU {env.get('veth0_mtu', '?')} (active_mtu {env.get('rxe_active_mtu', '?')}); rdma-core "
  f"{host.get('rdma_core', '?')}, perftest {host.get('perftest', '?')}, iperf3 {host.get('iperf3', '?')}; "
  f"RSOCK_SPIN_US {env.get('rsock_spin_us', '?')}. Wall time {host.get('wall_s', '?')} s including the boot.")
w("")
w("Everything in the guest is emulated and 10–100× slower than real hardware, and noisy: "
  "only the ratios within this run mean anything.")
w("")

# ---- summary ---------------------------------------------------------------------------
w("## Summary")
w("")
w("RTT = round trip, µs; median = median over runs of each run's median; p99 = median over "
  "runs of each run's 99th percentile. Throughput in Mbit/s (10⁶ bit/s): median over runs "
  "(worst run in brackets).")
w("")
w("| metric | verbs (limit) | rsocket | kernel TCP | **rsock** | rsock/verbs | rsock/rsocket | rsock/TCP | target |")
w("|---|---:|---:|---:|---:|---:|---:|---:|---|")
for size in (64, 4096):
    if size not in lat_sizes:
        continue
    for field, label in (("median_us", "median"), ("p99_us", "p99")):
        v = med("lat", "verbs", size, field)
        rs = rsocket_lat(size, field)
        t = med("lat", "tcp", size, field)
        k = med("lat", "rsock", size, field)
        tgt = "≤ 1.3× verbs, < rsocket" if field == "median_us" else ""
        w(f"| ping-pong RTT {hsize(size)}, {label} (µs) | {f(v)} | {f(rs)} | {f(t)} | **{f(k)}** | "
          f"{ratio(k, v)} | {ratio(k, rs)} | {ratio(k, t)} | {tgt} |")
for size in (64, 4096):
    # The same ping-pong waiting in epoll_wait (pingpong --epoll), as an event loop does;
    # librspreload has no epoll support, so rsocket has no figure here.
    t = med("lat", "tcp-epoll", size, "median_us")
    k = med("lat", "rsock-epoll", size, "median_us")
    if k is not None or t is not None:
        w(f"| ping-pong RTT {hsize(size)}, epoll-driven, median (µs) | | | {f(t)} | **{f(k)}** | "
          f"{ratio(k, med('lat', 'verbs', size, 'median_us'))} | | {ratio(k, t)} | |")


def bwcell(path, size):
    m = med("bw", path, size, "mbps")
    if m is None:
        return "—", None
    n = nruns("bw", path, size, "mbps")
    return (f"{f(m)} ({f(lo('bw', path, size, 'mbps'))})" if n > 1 else f(m)), m


big = max(bw_sizes) if bw_sizes else None
for P in (1, 4):
    kc, k = bwcell("rsock", f"iperf3-P{P}")
    tc, t = bwcell("tcp", f"iperf3-P{P}")
    vc, v = bwcell("verbs", big) if big else ("—", None)
    rc, rsv = bwcell("rsocket", big) if big else ("—", None)
    w(f"| streaming, iperf3 -P {P} (Mbit/s) | {vc} | {rc} | {tc} | **{kc}** | {ratio(k, v)} | {ratio(k, rsv)} | "
      f"{ratio(k, t)} | {'≥ 0.9× verbs, > rsocket' if P == 1 else ''} |")
for size in (64, 4096):
    k = med("lat", "rsock", size, "median_us")
    for path, what in (("rdmapp", "rsock's verbs layer alone, busy-polling (`rdma_pingpong`)"),
                       ("rdmapp-events", "rsock's verbs layer alone, sleeping on CQ events (`rdma_pingpong --events`)"),
                       ("verbs-events", "perftest sleeping on CQ events (`ib_send_lat -e`)")):
        ve = med("lat", path, size, "median_us")
        if ve is not None:
            w(f"| reference: RTT {hsize(size)}, {what}, median (µs) | {f(ve)} | | | **{f(k)}** | {ratio(k, ve)} | | | |")
for path, what in (("rdmapp", "credit-limited 64 KiB stream on rsock's verbs layer (`rdma_pingpong`)"),
                   ("rdmapp-events", "the same, sleeping on CQ events")):
    ve = med("bw", path, 65536, "mbps")
    k = med("bw", "rsock", "iperf3-P1", "mbps")
    if ve is not None:
        w(f"| reference: {what} vs iperf3 -P 1 (Mbit/s) | {f(ve)} | | | **{f(k)}** | {ratio(k, ve)} | | | |")
kc = med("bw", "rsock", "iperf3-P1", "cpu_s_gb")
tc = med("bw", "tcp", "iperf3-P1", "cpu_s_gb")
w(f"| CPU s per GB moved (iperf3 -P 1, both ends) | — | — | {f(tc, 2)} | **{f(kc, 2)}** | | | {ratio(kc, tc)} | |")
kc = med("lat", "rsock", 64, "cpu_us_rt")
tc = med("lat", "tcp", 64, "cpu_us_rt")
rsc = med("lat", "rspreload", 64, "cpu_us_rt")
w(f"| CPU s per 1 M round trips (64 B, both ends) | — | {f(rsc)} | {f(tc)} | **{f(kc)}** | | {ratio(kc, rsc)} | {ratio(kc, tc)} | |")
w("")
w(f"verbs: `ib_write_lat -R` (RTT = 2 × its one-way t_typical / 99% figures) and `ib_write_bw -R` at "
  f"{hsize(big) if big else '?'}; rsocket: "
  + ("`pingpong` under librspreload for latency (same program as rsock and TCP)" if rsp_ok else "`rstream` mean RTT (no percentiles)")
  + f", `rstream` {hsize(big) if big else '?'} bandwidth test for throughput (iperf3 does not run under librspreload); "
  "TCP and rsock: `examples/pingpong` and iperf3 (128 KiB writes). TCP's client runs in namespace "
  "`plain` (10.77.0.2 → 10.77.0.1 across the veth pair); everything else uses 10.77.0.1 on rxe0.")
w("")

# ---- latency by size ---------------------------------------------------------------------
w("## Latency vs message size")
w("")
w("![latency vs size](latency.png)")
w("")
w("Median RTT in µs [p99]; ranges are the spread of run medians.")
w("")
w("| size | verbs `ib_write_lat` | verbs layer, polling (`rdma_pingpong`) | verbs layer, sleeping (`--events`) | `ib_send_lat -e` (sleeping) | rstream (mean) | librspreload pingpong | TCP pingpong | rsock pingpong | rsock/verbs | rsock/rsocket | rsock/TCP |")
w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
dat = ["# size verbs rstream_mean rspreload tcp rsock   (median RTT, µs)"]


def latcell(path, size, field="median_us"):
    m = med("lat", path, size, field)
    if m is None:
        return "—"
    p = med("lat", path, size, "p99_us") if field == "median_us" else None
    n = nruns("lat", path, size, field)
    s = f(m)
    if p is not None:
        s += f" [{f(p)}]"
    if n > 1:
        s += f" ({f(lo('lat', path, size, field))}–{f(hi('lat', path, size, field))})"
    return s


for size in lat_sizes:
    k = med("lat", "rsock", size, "median_us")
    w(f"| {hsize(size)} | {latcell('verbs', size)} | {latcell('rdmapp', size)} | {latcell('rdmapp-events', size)} | {latcell('verbs-events', size)} | {latcell('rstream', size, 'mean_us')} | {latcell('rspreload', size)} | "
      f"{latcell('tcp', size)} | {latcell('rsock', size)} | {ratio(k, med('lat', 'verbs', size, 'median_us'))} | "
      f"{ratio(k, rsocket_lat(size, 'median_us'))} | {ratio(k, med('lat', 'tcp', size, 'median_us'))} |")
    vals = [med("lat", "verbs", size, "median_us"), med("lat", "rstream", size, "mean_us"),
            med("lat", "rspreload", size, "median_us"), med("lat", "tcp", size, "median_us"), k]
    dat.append(f"{size} " + " ".join("NaN" if x is None else f"{x:.2f}" for x in vals))
(d / "latency.dat").write_text("\n".join(dat) + "\n")
w("")

# ---- throughput --------------------------------------------------------------------------
w("## Throughput")
w("")
w("Mbit/s, median over runs (worst–best).")
w("")
w("| test | verbs `ib_write_bw` | rsocket `rstream` | kernel TCP | rsock | rsock/verbs | rsock/rsocket | rsock/TCP |")
w("|---|---:|---:|---:|---:|---:|---:|---:|")


def bwr(path, size):
    m = med("bw", path, size, "mbps")
    if m is None:
        return "—"
    return f"{f(m)} ({f(lo('bw', path, size, 'mbps'))}–{f(hi('bw', path, size, 'mbps'))})"


for size in bw_sizes:
    w(f"| {hsize(size)} messages | {bwr('verbs', size)} | {bwr('rsocket', size)} | | | | | |")
for path, what in (("rdmapp", "rsock's verbs layer alone, 64 KiB credit-limited stream (`rdma_pingpong`)"),
                   ("rdmapp-events", "the same, sleeping on CQ events")):
    if med("bw", path, 65536, "mbps") is not None:
        w(f"| {what} | {bwr(path, 65536)} | | | | | | |")
for P in (1, 4):
    k = med("bw", "rsock", f"iperf3-P{P}", "mbps")
    t = med("bw", "tcp", f"iperf3-P{P}", "mbps")
    v = med("bw", "verbs", big, "mbps") if big else None
    rs = med("bw", "rsocket", big, "mbps") if big else None
    w(f"| iperf3 -P {P} (128 KiB writes) | | | {bwr('tcp', f'iperf3-P{P}')} | {bwr('rsock', f'iperf3-P{P}')} | "
      f"{ratio(k, v)} | {ratio(k, rs)} | {ratio(k, t)} |")
w("")
w(f"Ratios against verbs and rsocket use their {hsize(big) if big else '?'} figures.")
w("")

# ---- CPU ---------------------------------------------------------------------------------
w("## CPU cost")
w("")
w("User + system CPU of both processes (all threads). Ping-pong: from `getrusage` around the "
  "timed round trips, in CPU µs per round trip = CPU s per 1 M round trips; context switches "
  "per round trip likewise. Streaming: iperf3's own CPU figures (client + server) × seconds / GB.")
w("")
w("| | kernel TCP | rsock | librspreload | rsock/TCP |")
w("|---|---:|---:|---:|---:|")
for size in lat_sizes:
    t, k, r = (med("lat", p, size, "cpu_us_rt") for p in ("tcp", "rsock", "rspreload"))
    w(f"| CPU s / 1 M round trips, {hsize(size)} | {f(t)} | {f(k)} | {f(r)} | {ratio(k, t)} |")
for size in (64, 4096):
    t, k, r = (med("lat", p, size, "csw_rt") for p in ("tcp", "rsock", "rspreload"))
    w(f"| context switches / round trip, {hsize(size)} | {f(t, 2)} | {f(k, 2)} | {f(r, 2)} | {ratio(k, t)} |")
for P in (1, 4):
    t, k = med("bw", "tcp", f"iperf3-P{P}", "cpu_s_gb"), med("bw", "rsock", f"iperf3-P{P}", "cpu_s_gb")
    w(f"| CPU s / GB, iperf3 -P {P} | {f(t, 2)} | {f(k, 2)} | — | {ratio(k, t)} |")
w("")

# ---- profile -------------------------------------------------------------------------------
prof = [r for r in recs if r["kind"] == "prof"]
if prof:
    w("## Where the time goes: syscalls per round trip")
    w("")
    piters = next((r.get("iters") for r in recs if r["kind"] == "profrun"), "?")
    w(f"`strace -f` of one 64 B ping-pong client and its server ({piters} timed round trips after 50 "
      "warm-up ones; only the calls between pingpong's two `getrusage` calls count). `main` = the "
      "program's thread, `other` = threads the shim (or librspreload) started. strace slows every "
      "call, so these runs' latencies are not comparable; the counts are.")
    w("")
    cols = []
    for path in ("rsock", "tcp", "rspreload"):
        for side in ("client", "server"):
            for th in ("main", "other"):
                if any(r["path"] == path and r["side"] == side and r["thread"] == th for r in prof):
                    cols.append((path, side, th))
    calls = defaultdict(dict)
    for r in prof:
        calls[r["syscall"]][(r["path"], r["side"], r["thread"])] = float(r["per_rt"])
    names = sorted((n for n in calls if n != "ALL"), key=lambda n: -max(calls[n].values()))
    w("| syscall | " + " | ".join(f"{p} {s} {t}" for p, s, t in cols) + " |")
    w("|---|" + "---:|" * len(cols))
    for n in ["ALL"] + names:
        label = "**all**" if n == "ALL" else f"`{n}`"
        w(f"| {label} | " + " | ".join(f"{calls[n][c]:.2f}" if c in calls[n] else "" for c in cols) + " |")
    w("")
    pr = [r for r in recs if r["kind"] == "profrun"]
    if pr:
        w("Under strace: " + "; ".join(f"{r['label']} median {r['median_us']} µs, {r['cli_csw_rt']}+{r['srv_csw_rt']} "
                                       f"context switches/RT" for r in pr) + ".")
        w("")

spin = [r for r in recs if r["kind"] == "spin"]
if spin:
    w("## RSOCK_SPIN_US sweep (rsock ping-pong, one run each)")
    w("")
    w("| RSOCK_SPIN_US | size | median µs | p99 µs | CPU s / 1 M RT (cli+srv) | context switches / RT (cli+srv) |")
    w("|---:|---|---:|---:|---:|---:|")
    for r in spin:
        cpu = float(r["cli_cpu_us_rt"]) + float(r["srv_cpu_us_rt"])
        csw = float(r["cli_csw_rt"]) + float(r["srv_csw_rt"])
        w(f"| {r['spin_us']} | {hsize(r['size'])} | {r['median_us']} | {r['p99_us']} | {cpu:.1f} | {csw:.2f} |")
    w("")

notes = [r for r in recs if r["kind"] == "note"]
fails = [r for r in recs if r["kind"] == "fail"]
w("## Failures and notes")
w("")
if not fails:
    w("No measurement failed; every rsock process had `conns.rdma > 0` and `conns.tcp == 0` in `rsock stat`.")
for r in fails:
    w(f"- **FAILED** {r['what']}: {r['text']}")
for r in notes:
    w(f"- note, {r['what']}: {r['text']}")
w("")
(d / "report.md").write_text("\n".join(out) + "\n")
print(f"report: {d / 'report.md'}", file=sys.stderr)
