#!/usr/bin/env bash
# Hardening (issue #11) in the Soft-RoCE guest: what happens when one side cannot pin memory.
# An RDMA connection needs its ring and send buffer registered (pinned, RLIMIT_MEMLOCK for a
# process without CAP_IPC_LOCK); a side that cannot gets none and the connection runs on
# kernel TCP — the data intact, the reason counted ("resources"), and the server not
# remembered as one that cannot do RDMA (no "negative_cache" on the next connect). A side
# that can pin a connection's first 32 KiB but not the bigger buffers a stream asks for
# stays on RDMA with small buffers (memlock_no_growth).
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh -- tests/rdma/hardening.sh [PATTERN[,PATTERN...]]
#
# Prints "PASS cell (Ns)" / "FAIL cell: why", then "N passed, N failed"; exit 1 on failure.

set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need nc.openbsd ss timeout sha256sum rdma setpriv
PATTERN=${1:-}
MUT=0
A=$RDMA_VM_ADDR
NC=nc.openbsd
EX=$T_EXAMPLES
T=120
CTO=5000
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/hardening-$RUN_ID
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
[ -x "$EX/echo_server" ] || { echo "missing $EX/echo_server (cargo build --release --examples)" >&2; exit 2; }
DATA=$T_WORK/data.bin
make_random "$DATA" 1
chmod o+rx "$T_WORK" "$DATA"

# LOCKED KIB CMD...: CMD as user nobody with RLIMIT_MEMLOCK at KIB KiB (hard too: nobody
# cannot raise it again); put after `shimmed DIR`. 16 KiB holds less than a connection's
# start (a 16 KiB ring and a 16 KiB send buffer); 64 KiB holds that, not a grown buffer.
LOCKED=(bash -c 'ulimit -l "$0" && exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"')

# open_for_nobody NAME...: stats dirs and logs the unprivileged side can write.
open_for_nobody() {
    chmod o+rx "$CELL_DIR"
    local n
    for n in "$@"; do
        mkdir -p "$CELL_DIR/$n" && chmod 1777 "$CELL_DIR/$n"
        : > "$CELL_DIR/$n.log" && chmod 666 "$CELL_DIR/$n.log"
    done
}

# fetch NAME: one connection to the echo server sends DATA; the echo must match.
fetch() {
    bg_in "$1" $T "$DATA" "${@:2}" $NC -N "$A" "$PORT"
    bg_wait "$1" || fail "$1 exited $?: $(tail -c 300 "$CELL_DIR/$1.err" | paste -sd' ')"
    expect_same_file "$DATA" "$CELL_DIR/$1.out" "$1"
}

cell_memlock_server() {
    open_for_nobody srv
    bg srv $T shimmed "$CELL_DIR/srv" "${LOCKED[@]}" 16 "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    fetch cli1 shimmed "$CELL_DIR/cli"
    fetch cli2 shimmed "$CELL_DIR/cli"
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==0' 'conns.tcp==2' 'fallback.resources==2' \
        'fallback.negative_cache==0' 'fallback.rejected==0'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma==0' 'conns.tcp==2' 'fallback.peer_tcp==2'
    reasons cli
    reasons srv
    local why
    why=$(grep -m1 'refusing rdma connection' "$CELL_DIR/srv.log")
    echo "# server: ${why#*] }"
    grep -q 'refusing rdma connection.*ibv_reg_mr' "$CELL_DIR/srv.log" ||
        soft fail "the server's log does not say it refused for want of registered memory: ${why:-nothing}"
    bg_stop srv
    expect_qps_released
}

cell_memlock_client() {
    open_for_nobody cli
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    fetch cli1 shimmed "$CELL_DIR/cli" "${LOCKED[@]}" 16
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==0' 'conns.tcp==1' 'fallback.resources==1'
    reasons cli
    grep -q 'ibv_reg_mr' "$CELL_DIR/cli.log" ||
        soft fail "the client's log does not name the failed registration: $(grep -m1 'rdma connect' "$CELL_DIR/cli.log")"
    # A healthy pair still goes over RDMA afterwards.
    rdma_begin
    fetch cli2 shimmed "$CELL_DIR/cli2"
    soft rdma_end "$(stat -c %s "$DATA")" 0  # 1 MiB is over before the QP sampler looks
    soft expect_rdma cli2 1
    bg_stop srv
    expect_qps_released
}

# The server pins each connection's first 32 KiB but not the 256 KiB ring a 1 MiB echo asks
# for: both connections stay on RDMA with small buffers, the echo intact, the refusal logged.
cell_memlock_no_growth() {
    open_for_nobody srv
    bg srv $T shimmed "$CELL_DIR/srv" "${LOCKED[@]}" 64 "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    fetch cli1 shimmed "$CELL_DIR/cli"
    fetch cli2 shimmed "$CELL_DIR/cli"
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==2' 'conns.tcp==0'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma==2' 'conns.tcp==0' 'grown.rings==0' \
        'grown.send==0'
    local why
    why=$(grep -m1 'stays small' "$CELL_DIR/srv.log")
    echo "# server: ${why#*] }"
    [ -n "$why" ] || soft fail "the server's log does not say a buffer stayed small"
    bg_stop srv
    expect_qps_released
}

CELLS=(memlock_server memlock_client memlock_no_growth)
for c in "${CELLS[@]}"; do
    selected "$c" && run_cell "$c"
done
t_summary
