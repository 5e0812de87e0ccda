#!/usr/bin/env bash
# What the shim costs on paths it does not accelerate (no RDMA device involved), measured
# side by side with and without LD_PRELOAD in one run:
#   (a) read/write on non-socket fds: instructions per call (valgrind callgrind, inclusive
#       cost of the loop functions of examples/overhead_loop.rs, N calls each) and ns per
#       call (the same loops timed in-process, median of R alternating runs);
#   (b) iperf3 over kernel loopback, client and server both shimmed or both not (R runs of
#       S seconds each, alternating), median Gbit/s and the ratio.
# Targets: <= 30 instructions added per non-socket call, <= 2% iperf3 throughput loss.
#
# usage: bench/overhead/run.sh
#   RSOCK_SO / RSOCK_EXAMPLES as for the tests; build first: cargo build --release && cargo build --release --examples
#   B_N (calls per loop under callgrind, default 1000000), B_TN (timed calls, default 2000000)
#   B_RUNS (default 5), B_SECS (iperf3 seconds per run, default 5)
# Needs: valgrind (callgrind, callgrind_annotate), iperf3, python3, iproute2 (ss).

set -u
. "$(dirname "$0")/../../tests/lib/common.sh"
t_init
need valgrind callgrind_annotate iperf3 python3 ss
N=${B_N:-1000000}
TN=${B_TN:-2000000}
RUNS=${B_RUNS:-5}
SECS=${B_SECS:-5}
LOOP=$T_EXAMPLES/overhead_loop
[ -x "$LOOP" ] || { echo "missing $LOOP (cargo build --release --examples)" >&2; exit 2; }
CELL_DIR=$T_WORK/bench; mkdir -p "$CELL_DIR"; : > "$CELL_DIR/.pids"
trap 'kill_cell_procs; t_cleanup_all' EXIT
SHIM=(env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$T_WORK/stats")
PLAIN=(env)

median() { python3 -c 'import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
best_low() { python3 -c 'import sys; print(min(float(x) for x in sys.argv[1:]))' "$@"; }
best_high() { python3 -c 'import sys; print(max(float(x) for x in sys.argv[1:]))' "$@"; }

# ---- (a) instructions per call ------------------------------------------------------------

# callgrind_per_call OUTFILE FUNC: inclusive Ir of overhead_loop::FUNC divided by N.
callgrind_per_call() {
    callgrind_annotate --inclusive=yes "$1" 2>/dev/null \
        | awk -v f=":overhead_loop::$2 " -v n="$N" 'index($0, f) && /\[/ { gsub(",", "", $1); printf "%.2f\n", $1 / n; exit }'
}

echo "# (a) callgrind, N=$N calls each of write(/dev/null, 1) and read(/dev/zero, 1)"
for side in plain shim; do
    if [ $side = shim ]; then pre=("${SHIM[@]}"); else pre=("${PLAIN[@]}"); fi
    "${pre[@]}" valgrind --tool=callgrind --callgrind-out-file="$T_WORK/cg.$side" "$LOOP" count "$N" \
        > "$T_WORK/cg.$side.log" 2>&1 || { echo "callgrind run ($side) failed:"; tail "$T_WORK/cg.$side.log"; exit 1; }
done
W0=$(callgrind_per_call "$T_WORK/cg.plain" writes); W1=$(callgrind_per_call "$T_WORK/cg.shim" writes)
R0=$(callgrind_per_call "$T_WORK/cg.plain" reads);  R1=$(callgrind_per_call "$T_WORK/cg.shim" reads)
[ -n "$W0" ] && [ -n "$W1" ] && [ -n "$R0" ] && [ -n "$R1" ] || { echo "could not read callgrind output" >&2; exit 1; }

# For scale: the same count on a loopback TCP connection the shim tracks (and counts bytes
# of): N pairs of write(1 byte) + read(1 byte), N/10 of them.
TCPN=$(( N / 10 ))
echo "# (a\") callgrind, $TCPN write+read pairs of 1 byte on a tracked loopback TCP connection"
for side in plain shim; do
    if [ $side = shim ]; then pre=("${SHIM[@]}"); else pre=("${PLAIN[@]}"); fi
    "${pre[@]}" valgrind --tool=callgrind --callgrind-out-file="$T_WORK/cgt.$side" "$LOOP" count-tcp "$TCPN" \
        > "$T_WORK/cgt.$side.log" 2>&1 || { echo "callgrind run ($side) failed:"; tail "$T_WORK/cgt.$side.log"; exit 1; }
done
N_SAVE=$N; N=$TCPN
T0=$(callgrind_per_call "$T_WORK/cgt.plain" tcp_pingpong); T1=$(callgrind_per_call "$T_WORK/cgt.shim" tcp_pingpong)
N=$N_SAVE
[ -n "$T0" ] && [ -n "$T1" ] || { echo "could not read callgrind output (tcp)" >&2; exit 1; }

# ---- (a') ns per call ---------------------------------------------------------------------

echo "# (a') timed in-process, $TN calls per loop, $RUNS runs each, alternating"
declare -a WN0 WN1 RN0 RN1
for i in $(seq "$RUNS"); do
    for side in plain shim; do
        if [ $side = shim ]; then pre=("${SHIM[@]}"); else pre=("${PLAIN[@]}"); fi
        out=$("${pre[@]}" "$LOOP" time "$TN") || { echo "timed run failed" >&2; exit 1; }
        w=$(awk '$1=="write_ns"{print $2}' <<< "$out"); r=$(awk '$1=="read_ns"{print $2}' <<< "$out")
        if [ $side = shim ]; then WN1+=("$w"); RN1+=("$r"); else WN0+=("$w"); RN0+=("$r"); fi
    done
done
WT0=$(median "${WN0[@]}"); WT1=$(median "${WN1[@]}"); RT0=$(median "${RN0[@]}"); RT1=$(median "${RN1[@]}")
WB0=$(best_low "${WN0[@]}"); WB1=$(best_low "${WN1[@]}"); RB0=$(best_low "${RN0[@]}"); RB1=$(best_low "${RN1[@]}")

# ---- (b) iperf3 ---------------------------------------------------------------------------

echo "# (b) iperf3 over loopback, $RUNS x ${SECS}s per side, alternating"
declare -a G0 G1 C0 C1
for i in $(seq "$RUNS"); do
    for side in plain shim; do
        if [ $side = shim ]; then pre=("${SHIM[@]}"); else pre=("${PLAIN[@]}"); fi
        alloc_port port
        bg srv $((SECS + 30)) "${pre[@]}" iperf3 -s -1 -B 127.0.0.1 -p "$port"
        wait_listen "$port" 10 srv || { echo "iperf3 server did not start" >&2; exit 1; }
        bg cli $((SECS + 30)) "${pre[@]}" iperf3 -c 127.0.0.1 -p "$port" -t "$SECS" -J
        bg_wait cli || { echo "iperf3 client failed: $(tail -c 300 "$CELL_DIR/cli.err")" >&2; exit 1; }
        bg_wait srv
        g=$(json_get "$CELL_DIR/cli.out" 'j["end"]["sum_received"]["bits_per_second"] / 1e9')
        # CPU seconds (both ends, user+system) per GB moved: less sensitive than Gbit/s to
        # other load on the machine.
        c=$(json_get "$CELL_DIR/cli.out" '(j["end"]["cpu_utilization_percent"]["host_total"] + j["end"]["cpu_utilization_percent"]["remote_total"]) / 100 * j["end"]["sum_received"]["seconds"] / (j["end"]["sum_received"]["bytes"] / 1e9)')
        printf '  run %d %-5s %6.2f Gbit/s  %.3f CPU s/GB\n' "$i" "$side" "$g" "$c"
        if [ $side = shim ]; then G1+=("$g"); C1+=("$c"); else G0+=("$g"); C0+=("$c"); fi
    done
done
GM0=$(median "${G0[@]}"); GM1=$(median "${G1[@]}")
GB0=$(best_high "${G0[@]}"); GB1=$(best_high "${G1[@]}")
GL0=$(best_low "${G0[@]}"); GL1=$(best_low "${G1[@]}")
CM0=$(median "${C0[@]}"); CM1=$(median "${C1[@]}")

# ---- report -------------------------------------------------------------------------------

python3 - "$W0" "$W1" "$R0" "$R1" "$WT0" "$WT1" "$RT0" "$RT1" "$GM0" "$GM1" \
    "$WB0" "$WB1" "$RB0" "$RB1" "$GB0" "$GB1" "$T0" "$T1" "$CM0" "$CM1" "$GL0" "$GL1" <<'EOF'
import sys
w0, w1, r0, r1, wt0, wt1, rt0, rt1, g0, g1, wb0, wb1, rb0, rb1, gb0, gb1, t0, t1, c0, c1, gl0, gl1 = map(float, sys.argv[1:])
rows = [
    ("tracked TCP write+read instr/pair", t0, t1, f"{(t1 - t0) / 2:+.1f} instr per call"),
    ("write(/dev/null) instr/call", w0, w1, f"{w1 - w0:+.1f} instr"),
    ("read(/dev/zero) instr/call", r0, r1, f"{r1 - r0:+.1f} instr"),
    ("write(/dev/null) ns/call (median)", wt0, wt1, f"{wt1 - wt0:+.1f} ns"),
    ("write(/dev/null) ns/call (best)", wb0, wb1, f"{wb1 - wb0:+.1f} ns"),
    ("read(/dev/zero) ns/call (median)", rt0, rt1, f"{rt1 - rt0:+.1f} ns"),
    ("read(/dev/zero) ns/call (best)", rb0, rb1, f"{rb1 - rb0:+.1f} ns"),
    ("iperf3 loopback Gbit/s (median)", g0, g1, f"ratio {g1 / g0:.3f} ({(g1 / g0 - 1) * 100:+.1f}%)"),
    ("iperf3 loopback Gbit/s (best)", gb0, gb1, f"ratio {gb1 / gb0:.3f} ({(gb1 / gb0 - 1) * 100:+.1f}%)"),
    ("iperf3 CPU s per GB (median)", c0, c1, f"ratio {c1 / c0:.3f} ({(c1 / c0 - 1) * 100:+.1f}%)"),
]
print()
print(f"{'metric':36} {'without':>10} {'with shim':>10}  added")
for name, a, b, d in rows:
    print(f"{name:36} {a:10.2f} {b:10.2f}  {d}")
added = max(w1 - w0, r1 - r0)
loss = (1 - g1 / g0) * 100
print()
print(f"target instructions added per non-socket call <= 30: {added:.1f} -> {'met' if added <= 30 else 'NOT met'}")
print(f"target iperf3 throughput loss <= 2% (medians): {loss:.1f}% -> {'met' if loss <= 2 else 'NOT met'}")
spread = max((gb0 - gl0) / g0, (gb1 - gl1) / g1) * 100
print(f"iperf3 run-to-run spread: {gl0:.2f}-{gb0:.2f} Gbit/s without, {gl1:.2f}-{gb1:.2f} with "
      f"({spread:.0f}% of the median){' -- too noisy to resolve 2%' if spread > 4 else ''}")
with open("/proc/loadavg") as f:
    print(f"load average at the end: {' '.join(f.read().split()[:3])} (timings are only meaningful on an idle machine)")
EOF
