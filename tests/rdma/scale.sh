#!/usr/bin/env bash
# More connections per process than one completion queue serves (issue #12), in the
# Soft-RoCE guest. A client opens T_SCALE_N (default 600) connections one after another to
# one echo server, keeps them all open, echoes a message on each, then closes them. rxe's
# largest CQ holds about 255 connections' worth of entries, so both processes need several
# CQs from their device's pool. Asserts: every connection on RDMA at both ends (the shim's
# counters), every echo verified, more than one CQ per process (`rdma resource show cq` and
# the shim's log),
# nothing left afterwards.
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh -- tests/rdma/scale.sh [PATTERN]
set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need python3 rdma
PATTERN=${1:-}
MUT=0
A=$RDMA_VM_ADDR
EX=$T_EXAMPLES
N=${T_SCALE_N:-600}
T=600
CTO=10000
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/scale-$RUN_ID
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
[ -x "$EX/echo_server" ] || { echo "missing $EX/echo_server (cargo build --release --examples)" >&2; exit 2; }
ulimit -n 65536 2>/dev/null || true

CLIENT='import socket, sys, time
addr, port, n, flag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
socks = []
t0 = time.time()
for i in range(n):
    s = socket.create_connection((addr, port), timeout=120)
    s.settimeout(None)
    socks.append(s)
print("# %d connections open in %.1f s" % (n, time.time() - t0), flush=True)
open(flag, "w").close()
bad = 0
for i, s in enumerate(socks):
    m = b"conn %06d " % i * 4
    s.sendall(m)
    got = b""
    while len(got) < len(m):
        k = s.recv(len(m) - len(got))
        if not k:
            break
        got += k
    bad += got != m
print("# echoes verified: %d of %d" % (n - bad, n), flush=True)
for s in socks:
    s.close()
sys.exit(1 if bad else 0)'

# cq_count: CQs rxe0 lists (every process's; the bed itself holds one).
cq_count() { rdma resource show cq 2>/dev/null | grep -c 'cqn' || true; }

cell_many_cqs() {
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    bg cli $T shimmed "$CELL_DIR/cli" python3 -c "$CLIENT" "$A" "$PORT" "$N" "$CELL_DIR/all-open"
    wait_until 500 test -e "$CELL_DIR/all-open" || fail "the client did not open $N connections: $(tail -c 300 cli.err | paste -sd' ')"
    local cqs
    cqs=$(cq_count)
    echo "# with $N connections open: $cqs CQs on rxe0, $(rc_qps) RC QPs"
    [ "$cqs" -ge 5 ] || soft fail "$cqs CQs on rxe0 for $N connections per process, want at least 2 per process"
    # Each process made its second CQ when the first was full (the shim logs each one made).
    grep -q 'completion queue 2 of' "$CELL_DIR/srv.log" || soft fail "server: no second CQ made (log)"
    grep -q 'completion queue 2 of' "$CELL_DIR/cli.log" || soft fail "client: no second CQ made (log)"
    local rc=0
    bg_wait cli || rc=$?
    sed -n 's/^# /# client: /p' cli.out
    [ $rc -eq 0 ] || fail "client exited $rc: $(tail -c 300 cli.err | paste -sd' ')"
    soft expect_stats "$CELL_DIR/cli" cli -D N="$N" 'nproc==1' 'conns.rdma==N' 'conns.tcp==0'
    soft expect_stats "$CELL_DIR/srv" srv -D N="$N" 'nproc==1' 'conns.rdma==N' 'conns.tcp==0'
    reasons cli
    wait_until 60 no_rc_qps || soft fail "$(rc_qps) RC QP(s) left 60 s after the client closed everything (server alive)"
    bg_stop srv
    expect_qps_released
}

CELLS=(many_cqs)
for c in "${CELLS[@]}"; do
    selected "$c" && run_cell "$c"
done
t_summary
