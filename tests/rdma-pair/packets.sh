#!/usr/bin/env bash
# What a message costs on the wire and in wake-ups, across two hosts
# (tests/rdma-vm/run.sh --topology pair): node 1 echoes (examples/pingpong server), node 0
# sends N 64 B ping-pongs (examples/pingpong client, which checks every echo byte for
# byte), both under the shim; then N 64 B round trips of raw verbs (ib_write_lat) on the
# same wire. Checked on node 0:
#   - the packets its rxe0 sent and received per round trip (hw_counters) for rsock are at
#     most those of raw verbs plus 0.25 (credits returned in batches): a message is one
#     RDMA write with its ACK, as with verbs — a second crossing would show here;
#   - context switches per round trip, both ends together (the pingpong's own getrusage
#     counts), at most 3: each blocked read sleeps once; a helper thread woken by every
#     completion made it 4;
#   - the shim's counters: the connection was RDMA, none was TCP.
# Counts, not times: the bed's speed does not move them.
#
#   tests/rdma-vm/run.sh --topology pair --timeout 600 -- tests/rdma-pair/packets.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
# shellcheck source=../lib/common.sh
. tests/lib/common.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "FAIL packets: needs --topology pair"; exit 1; }
t_init
PORT=7330
N=300
EX=$T_EXAMPLES
[ -x "$EX/pingpong" ] || { echo "missing $EX/pingpong (cargo build --release --examples)" >&2; exit 2; }

if [ "$RDMA_VM_NODE" = 1 ]; then
    pair_shim "$T_WORK/srv" timeout 300 "$EX/pingpong" server "$RDMA_VM_SELF:$PORT" --once > "$T_WORK/srv.out" 2>&1 &
    wait_tcp_listen "$PORT" 60 && wait_rdma_listen "$PORT" 60 || { echo "FAIL packets: server did not listen"; exit 1; }
    pair_signal pp-up
    pair_wait verbs-go 300 || exit 1
    timeout 120 ib_write_lat -d rxe0 -s 64 -n $N > "$T_WORK/verbs.out" 2>&1 &
    sleep 2
    pair_signal verbs-up
    wait
    pair_barrier packets-end 300
    echo "PASS packets (node 1: served)"
    exit 0
fi

fails=0
bad() { echo "FAIL packets: $*"; fails=$((fails + 1)); }
pair_wait pp-up 240 || { echo "FAIL packets: no server"; exit 1; }
rxe_counters_snapshot "$T_WORK/c"
out=$(pair_shim "$T_WORK/cli" timeout 240 "$EX/pingpong" client "$RDMA_VM_PEER:$PORT" --size 64 --iters $N --warmup 20 --label rsock 2>&1)
rc=$?
d=$(rxe_counters_delta "$T_WORK/c")
echo "# $out"
[ $rc -eq 0 ] || bad "pingpong client exited $rc (an echo that differs fails it)"
rts=$((N + 20))
rs_sent=$(awk '$1 == "sent_pkts" { print $2 }' <<<"$d")
rs_rcvd=$(awk '$1 == "rcvd_pkts" { print $2 }' <<<"$d")
csw=$(sed -n 's/.* cli_csw_rt=\([0-9.]*\) srv_csw_rt=\([0-9.]*\).*/\1 \2/p' <<<"$out")

rxe_counters_snapshot "$T_WORK/c"
pair_signal verbs-go
pair_wait verbs-up 120 || exit 1
timeout 120 ib_write_lat -d rxe0 -s 64 -n $N "$RDMA_VM_PEER" > "$T_WORK/verbs.out" 2>&1 || bad "ib_write_lat failed: $(tail -n 3 "$T_WORK/verbs.out")"
d=$(rxe_counters_delta "$T_WORK/c")
v_sent=$(awk '$1 == "sent_pkts" { print $2 }' <<<"$d")
v_rcvd=$(awk '$1 == "rcvd_pkts" { print $2 }' <<<"$d")

per() { awk -v a="${1:-0}" -v n="$2" 'BEGIN { printf "%.2f", a / n }'; }
echo "# node 0, per 64 B round trip: rsock sent $(per "$rs_sent" $rts) received $(per "$rs_rcvd" $rts) packets; raw verbs sent $(per "$v_sent" $N) received $(per "$v_rcvd" $N)"
echo "# context switches per round trip (client, server): ${csw:-?}"
within() { awk -v r="${1:-0}" -v rn="$2" -v v="${3:-0}" -v vn="$4" 'BEGIN { exit !(r / rn <= v / vn + 0.25) }'; }
[ "${v_sent:-0}" -gt 0 ] || bad "no verbs packets counted"
within "$rs_sent" $rts "$v_sent" $N || bad "rsock sent $(per "$rs_sent" $rts) packets per round trip, raw verbs $(per "$v_sent" $N)"
within "$rs_rcvd" $rts "$v_rcvd" $N || bad "rsock received $(per "$rs_rcvd" $rts) packets per round trip, raw verbs $(per "$v_rcvd" $N)"
[ -n "$csw" ] && awk -v c="$csw" 'BEGIN { split(c, x, " "); exit !(x[1] + x[2] <= 3) }' ||
    bad "context switches per round trip (client, server): ${csw:-unknown}, want at most 3 together"
json=$(env -u LD_PRELOAD "$T_BIN" stat --dir "$T_WORK/cli" --all --json 2>&1)
conns=$(python3 -c 'import json,sys; c=[json.loads(l)["conns"] for l in sys.argv[1].splitlines() if l.strip()]; print(sum(x["rdma"] for x in c), sum(x["tcp"] for x in c))' "$json" 2>/dev/null)
[ "$conns" = "1 0" ] || bad "client's connections (rdma tcp): ${conns:-?}, want 1 0"
pair_barrier packets-end 300
[ $fails -eq 0 ] && echo "PASS packets (node 0: a 64 B message costs raw verbs' packets, one sleep per blocked read)" && exit 0
tail -n 20 "$T_WORK/cli.log" | sed 's/^/    | cli: /'
exit 1
