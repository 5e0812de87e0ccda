#!/usr/bin/env bash
# Socket options an RDMA stream follows itself (SO_RCVTIMEO, SO_LINGER with a zero timeout),
# set before connect (the shim then reads them from the socket) and after (it follows the
# setsockopt), on a stream of its own queue pair and on a link (RSOCK_LINKS=1). A connect
# on a socket with no such option set reads nothing (the shim knows the defaults): these
# cells are what says that knowing is right.
#
# options_qp, options_links: tests/rdma/options/peers.py; asserts: a blocked recv with
#   SO_RCVTIMEO 300 ms fails with EAGAIN after about that long and the stream still reads
#   what comes later; a close with SO_LINGER {1, 0} resets the peer (ECONNRESET), a close
#   without it ends the stream (EOF); every connection on RDMA at both ends (the shim's
#   counters), over a link in options_links; no RC QP left.
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh -- tests/rdma/options.sh [PATTERN]
set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need python3 rdma
PATTERN=${1:-}
MUT=0
A=$RDMA_VM_ADDR
T=120
CTO=10000
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/options-$RUN_ID
PEERS=$T_ROOT/tests/rdma/options/peers.py
CASES=(rcvtimeo_before rcvtimeo_after linger0_before linger0_after linger_unset)

# options LINKS: the client's cases against the server, both with RSOCK_LINKS=LINKS.
options() {
    local links=$1 n=${#CASES[@]} rc=0 c
    bg srv $T shimmed "$CELL_DIR/srv" RSOCK_LINKS="$links" python3 "$PEERS" server "$A" "$PORT" "$n"
    wait_dual srv
    bg cli $T shimmed "$CELL_DIR/cli" RSOCK_LINKS="$links" python3 "$PEERS" client "$A" "$PORT"
    bg_wait cli || rc=$?
    bg_wait srv || true
    sed 's/^/# client: /' cli.out
    sed 's/^/# server: /' srv.out
    [ $rc -eq 0 ] || fail "client exited $rc: $(tail -c 300 cli.err | paste -sd' ')"
    for c in "${CASES[@]}"; do
        grep -q "^$c ok$" cli.out || fail "$c: $(grep "^$c " cli.out || echo 'no result')"
    done
    grep -qx 'linger0_before reset' srv.out || fail "SO_LINGER 0 set before connect: the server saw $(grep linger0_before srv.out || echo nothing)"
    grep -qx 'linger0_after reset' srv.out || fail "SO_LINGER 0 set after connect: the server saw $(grep linger0_after srv.out || echo nothing)"
    grep -qx 'linger_unset eof' srv.out || fail "a plain close: the server saw $(grep linger_unset srv.out || echo nothing)"
    soft expect_stats "$CELL_DIR/cli" cli -D N="$n" 'conns.rdma==N' 'conns.tcp==0'
    soft expect_stats "$CELL_DIR/srv" srv -D N="$n" 'conns.rdma==N' 'conns.tcp==0'
    if [ "$links" = 1 ]; then
        soft expect_stats "$CELL_DIR/cli" cli-links -D N="$n" 'links.made==1' 'links.streams==N'
    else
        soft expect_stats "$CELL_DIR/cli" cli-links 'links.made==0'
    fi
    expect_qps_released 30
}

cell_options_qp() { options 0; }
cell_options_links() { options 1; }

for c in options_qp options_links; do
    selected "$c" && run_cell "$c"
done
t_summary
