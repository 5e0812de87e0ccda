#!/usr/bin/env bash
# Many connections per process (issue #12), in the Soft-RoCE guest.
#
# thousand_conns: examples/scale_conns opens T_SCALE_N (default 1000) connections from 16
#   threads at once to one epoll echo server and keeps them all open, at the default sizes
#   (16 KiB rings and send buffers to start with). That is more than one completion queue serves (rxe's largest holds about
#   255 connections' worth of entries) and far beyond the server's backlog (128). Asserts:
#   every connection on RDMA at both ends (the shim's counters), every one echoed and
#   verified, every QP on the device while all are open (`rdma resource show`), more than
#   one CQ per process (the shim's log), 32 KiB pinned per connection (VmPin: no buffer
#   grew), nothing left afterwards.
# fd_limit: a client with `ulimit -n 48` opens 12 connections: the shim's own fds (2 per
#   RDMA connection) run out first; the connections that cannot get them fall back to TCP
#   with reason `resources` (the server counts them as `peer_tcp`: no half-made RDMA
#   connection), and all 12 carry their data.
# pinned_limit: a client with RSOCK_MAX_PINNED_MB=1 opens 40: 32 fit, 8 fall back with
#   `resources`.
# hca_objects: a client whose rdma cgroup allows 40 device objects opens 16 connections:
#   those beyond it fall back with `resources`, all carry their data.
# memlock: a client whose RLIMIT_MEMLOCK (ulimit -l 40, without CAP_IPC_LOCK) holds one
#   connection's memory opens 4: the first is on RDMA, the other three fall back to kernel
#   TCP with the reason counted as `resources`, and all four carry their data.
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh -- tests/rdma/scale.sh [PATTERN]
set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need python3 rdma setpriv pgrep
PATTERN=${1:-}
MUT=0
A=$RDMA_VM_ADDR
EX=$T_EXAMPLES
N=${T_SCALE_N:-1000}
T=600
CTO=10000
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/scale-$RUN_ID
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
[ -x "$EX/scale_conns" ] || { echo "missing $EX/scale_conns (cargo build --release --examples)" >&2; exit 2; }
ulimit -n 65536 2>/dev/null || true

# cq_count: CQs rxe0 lists (every process's; the bed itself holds one).
cq_count() { rdma resource show cq 2>/dev/null | grep -c 'cqn' || true; }
# cli_json EXPR: EXPR of the client's JSON line (j).
cli_json() { json_get "$CELL_DIR/cli.json" "$1"; }

cell_thousand_conns() {
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/scale_conns" server "$A:$PORT" "$N"
    wait_dual srv
    local spid
    spid=$(pgrep -n -f "scale_conns server $A:$PORT")
    bg cli $T shimmed "$CELL_DIR/cli" "$EX/scale_conns" client "$A:$PORT" "$N" \
        --par 16 --rtt 200 --server-pid "${spid:-0}"
    local rc=0
    bg_wait cli || rc=$?
    grep '^{' cli.out | tail -n1 > cli.json
    echo "# client: $(cat cli.json)"
    [ $rc -eq 0 ] || fail "client exited $rc: $(tail -c 300 cli.err | paste -sd' ')"
    [ "$(cli_json 'j["verified"]')" = "$N" ] || fail "$(cli_json 'j["verified"]') of $N connections verified"
    # Both ends' QPs were on the device while all connections were open.
    local qps
    qps=$(cli_json 'j["rc_qps"]')
    [ "${qps:-0}" -ge $((2 * N)) ] || soft fail "$qps RC QPs with $N connections open, want >= $((2 * N))"
    # 16 KiB ring + 16 KiB send buffer, and nothing else pinned per connection.
    cli_json 'j["cli_vmpin_kib"] <= 32 * j["n"] and j["srv_vmpin_kib"] <= 32 * j["n"] and j["cli_vmpin_kib"] > 0' |
        grep -qx True || soft fail "pinned: client $(cli_json 'j["cli_vmpin_kib"]') KiB, server $(cli_json 'j["srv_vmpin_kib"]') KiB for $N connections, want <= 32 KiB each"
    # Each process made its second CQ when the first was full (the shim logs each one made).
    grep -q 'completion queue 2 of' "$CELL_DIR/srv.log" || soft fail "server: no second CQ made (log)"
    grep -q 'completion queue 2 of' "$CELL_DIR/cli.log" || soft fail "client: no second CQ made (log)"
    expect_status srv 0
    soft expect_stats "$CELL_DIR/cli" cli -D N="$N" 'nproc==1' 'conns.rdma==N' 'conns.tcp==0'
    soft expect_stats "$CELL_DIR/srv" srv -D N="$N" 'nproc==1' 'conns.rdma==N' 'conns.tcp==0'
    soft expect_stats "$CELL_DIR/cli" cli-grown 'grown.rings==0' 'grown.send==0'
    soft expect_stats "$CELL_DIR/srv" srv-grown 'grown.rings==0' 'grown.send==0'
    reasons cli
    expect_qps_released 60
}

# exhaust_cell N WRAPPER...: N connections, one after another, from a client started through
# WRAPPER (what limits it), to a server without limits; all N must echo their bytes. Then
# the client's counters: K connections on TCP, every one for `resources`, and the server
# counting exactly K TCP peers (no half-made RDMA connection), K >= 1, at least one on RDMA.
exhaust_cell() {
    local n=$1 rc=0 k
    shift
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/scale_conns" server "$A:$PORT" "$n"
    wait_dual srv
    bg cli $T shimmed "$CELL_DIR/cli" "$@" "$EX/scale_conns" client "$A:$PORT" "$n" \
        --par 1 --rtt 10
    bg_wait cli || rc=$?
    grep '^{' cli.out | tail -n1 > cli.json
    echo "# client: $(cat cli.json)"
    [ $rc -eq 0 ] || fail "client exited $rc: $(tail -c 300 cli.err | paste -sd' ')"
    [ "$(cli_json 'j["verified"]')" = "$n" ] || fail "$(cli_json 'j["verified"]') of $n connections verified"
    expect_status srv 0
    soft expect_stats "$CELL_DIR/cli" cli -D N="$n" 'nproc==1' 'conns.rdma>=1' 'conns.tcp>=1' \
        'conns.rdma + conns.tcp==N' 'sum(vars(fallback).values())==fallback.resources==conns.tcp'
    k=$(json_get stats.cli.json 'j["conns"]["tcp"]' 2>/dev/null)
    soft expect_stats "$CELL_DIR/srv" srv -D N="$n" -D K="${k:-0}" 'nproc==1' 'conns.tcp==K' \
        'fallback.peer_tcp==K' 'conns.rdma + conns.tcp==N'
    reasons cli
    expect_qps_released 30
}

# Out of fds: the shim's own (2 per RDMA connection) run out first.
cell_fd_limit() { exhaust_cell 12 sh -c 'ulimit -n 48 && exec "$@"' sh; }

# Out of memlock: root ignores RLIMIT_MEMLOCK with CAP_IPC_LOCK, so the client runs without
# it; 40 KiB hold one connection's 32 KiB.
cell_memlock() {
    exhaust_cell 4 setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock sh -c 'ulimit -l 40 && exec "$@"' sh
    soft expect_stats "$CELL_DIR/cli" cli-count 'conns.rdma==1' 'conns.tcp==3'
    grep -m1 'ibv_reg_mr' "$CELL_DIR/cli.log" | sed 's/^/# client log: /'
}

# Out of the shim's own pinned-memory budget: 1 MiB holds 32 connections of 32 KiB.
cell_pinned_limit() {
    exhaust_cell 40 RSOCK_MAX_PINNED_MB=1
    soft expect_stats "$CELL_DIR/cli" cli-count 'conns.rdma==32' 'conns.tcp==8'
    grep -m1 'RSOCK_MAX_PINNED_MB' "$CELL_DIR/cli.log" | sed 's/^/# client log: /'
}

# Out of device objects (PDs, MRs, QPs, CQs): the kernel's rdma cgroup controller caps the
# client's; the connections that cannot get theirs fall back with `resources`.
cell_hca_objects() {
    local cg=/sys/fs/cgroup/rsock-scale-$$
    grep -q '^cgroup2 /sys/fs/cgroup ' /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
    echo +rdma > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    mkdir -p "$cg" && [ -e "$cg/rdma.max" ] || fail "no rdma cgroup controller (rdma.max) here"
    echo "rxe0 hca_handle=8 hca_object=40" > "$cg/rdma.max" || fail "cannot write $cg/rdma.max"
    # shellcheck disable=SC2016 # expanded by the inner shell
    exhaust_cell 16 sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg"
    echo "# rdma.current at the end: $(cat "$cg/rdma.current" 2>/dev/null)"
    grep -m1 -iE 'refus|falls back|resources' "$CELL_DIR/cli.log" | sed 's/^/# client log: /'
    rmdir "$cg" 2>/dev/null
}

CELLS=(thousand_conns memlock fd_limit pinned_limit hca_objects)
for c in "${CELLS[@]}"; do
    selected "$c" && run_cell "$c"
done
t_summary
