#!/usr/bin/env bash
# Runs on both guests of the two-host bed for bench/rdma/pair.sh: node 1 serves, node 0
# measures. Each round runs every cell once, in the same order, so the ratios within a
# round compare like with like. Node 0 writes DIR/data.txt: one line per measurement,
#   lat cell=C size=S round=R median_us=.. p99_us=..   (round-trip times)
#   pkts cell=C round=R rts=N sent=N rcvd=N            (node 0's rxe0 packets for N round trips)
#
#   bench/rdma/pair-guest.sh --out DIR [--rounds N] [--iters N]
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "pair-guest.sh: needs --topology pair" >&2; exit 2; }

OUT= ROUNDS=3 ITERS=1000
while (($#)); do
  case $1 in
    --out) OUT=${2:?}; shift ;;
    --rounds) ROUNDS=${2:?}; shift ;;
    --iters) ITERS=${2:?}; shift ;;
    *) echo "usage: $0 --out DIR [--rounds N] [--iters N]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OUT" ] || { echo "--out is required" >&2; exit 2; }
BIN=${BENCH_BIN:?BENCH_BIN (the copied binaries) must be set}
WORK=$(mktemp -d /tmp/rsock-pair-bench.XXXXXX)
WARM=50
# Cells: NAME PORT KIND, KIND = rsock|tcp (examples/pingpong, blocking or --epoll;
# rsock-nospin: RSOCK_SPIN_US=0 at both ends, as the two guests share two host cores and a
# waiter that polls takes them from the other guest) or
# perftest (ib_write_lat: RDMA WRITE polled in memory, busy; ib_send_lat -e: SEND, the
# waiter sleeps on the completion channel as a blocked rsock call does).
CELLS="rsock:7601:rsock tcp:7602:tcp rsock-epoll:7603:rsock tcp-epoll:7604:tcp rsock-nospin:7605:rsock write_lat:0:perftest send_lat_e:0:perftest"

shim() { # DIR CMD...
  local dir=$1 spin=1000; shift
  case $dir in *nospin*) spin=0 ;; esac
  env RSOCK_SPIN_US=$spin LD_PRELOAD="$BIN/librsock.so" RSOCK_STATS_DIR="$dir" RSOCK_STATS_KEEP=1 RSOCK_LOG="$dir.log" \
    RSOCK_CONNECT_TIMEOUT_MS=20000 "$@"
}
epoll_flag() { case $1 in *-epoll) echo --epoll ;; esac; }
perftest_cmd() { case $1 in write_lat) echo "ib_write_lat" ;; send_lat_e) echo "ib_send_lat -e" ;; esac; }

if [ "$RDMA_VM_NODE" = 1 ]; then
  for c in $CELLS; do
    IFS=: read -r name port kind <<<"$c"
    case $kind in
      rsock) shim "$WORK/$name" "$BIN/pingpong" server "$RDMA_VM_SELF:$port" $(epoll_flag "$name") >"$WORK/$name.out" 2>&1 & ;;
      tcp) "$BIN/pingpong" server "$RDMA_VM_SELF:$port" $(epoll_flag "$name") >"$WORK/$name.out" 2>&1 & ;;
    esac
  done
  for c in $CELLS; do
    IFS=: read -r name port kind <<<"$c"
    [ "$kind" = perftest ] || wait_tcp_listen "$port" 60 || { echo "pair-guest: server $name did not listen" >&2; exit 1; }
  done
  pair_signal servers-up
  for r in $(seq 1 "$ROUNDS"); do
    for c in $CELLS; do
      IFS=: read -r name port kind <<<"$c"
      [ "$kind" = perftest ] || continue
      for s in 64 4096; do
        [ "$name" = send_lat_e ] && [ $s = 4096 ] && continue
        pair_wait "go-$name-$s-$r" 300 || exit 1
        # shellcheck disable=SC2046
        timeout 180 $(perftest_cmd "$name") -d rxe0 -s $s -n "$ITERS" >"$WORK/pt.out" 2>&1 &
        pt=$!
        sleep 2
        pair_signal "up-$name-$s-$r"
        wait $pt
        pair_wait "done-$name-$s-$r" 300
      done
    done
  done
  pair_barrier end 600
  exit 0
fi

pair_wait servers-up 300 || exit 1
mkdir -p "$OUT"
data=$OUT/data.txt
: >"$data"
for r in $(seq 1 "$ROUNDS"); do
  for c in $CELLS; do
    IFS=: read -r name port kind <<<"$c"
    case $kind in
      rsock | tcp)
        rxe_counters_snapshot "$WORK/c"
        run=("$BIN/pingpong" client "$RDMA_VM_PEER:$port" --size 64,4096 --iters "$ITERS" --warmup $WARM --label "$name" $(epoll_flag "$name"))
        if [ "$kind" = rsock ]; then out=$(shim "$WORK/$name-cli-$r" "${run[@]}"); else out=$("${run[@]}"); fi
        d=$(rxe_counters_delta "$WORK/c")
        echo "$out" | awk -v c="$name" -v r="$r" '$1 == "pingpong" {
          for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
          printf "lat cell=%s size=%s round=%s median_us=%s p99_us=%s cli_csw_rt=%s srv_csw_rt=%s\n", c, v["size"], r, v["median_us"], v["p99_us"], v["cli_csw_rt"], v["srv_csw_rt"] }' >>"$data"
        rts=$((2 * (ITERS + WARM)))
        ;;
      perftest)
        rts=0
        rxe_counters_snapshot "$WORK/c"
        for s in 64 4096; do
          [ "$name" = send_lat_e ] && [ $s = 4096 ] && continue
          pair_signal "go-$name-$s-$r"
          pair_wait "up-$name-$s-$r" 120 || exit 1
          # shellcheck disable=SC2046
          line=$(timeout 180 $(perftest_cmd "$name") -d rxe0 -s $s -n "$ITERS" "$RDMA_VM_PEER" 2>&1 | awk -v s=$s '$1 == s')
          pair_signal "done-$name-$s-$r"
          # t_typical and the 99th percentile are half round trips: doubled, like for like.
          awk -v c="$name" -v s=$s -v r="$r" '{ printf "lat cell=%s size=%s round=%s median_us=%.1f p99_us=%.1f\n", c, s, r, 2 * $5, 2 * $8 }' <<<"$line" >>"$data"
          rts=$((rts + ITERS))
          sleep 1
        done
        d=$(rxe_counters_delta "$WORK/c")
        ;;
    esac
    sent=$(awk '$1 == "sent_pkts" { print $2 }' <<<"$d")
    rcvd=$(awk '$1 == "rcvd_pkts" { print $2 }' <<<"$d")
    [ "$kind" = tcp ] || echo "pkts cell=$name round=$r rts=$rts sent=${sent:-0} rcvd=${rcvd:-0}" >>"$data"
    echo "pair-guest: round $r $name done" >&2
  done
done
# rsock's own counters: every client process of an rsock cell had its connection on
# RDMA and none on TCP (a figure secretly measured over TCP would be worthless).
for r in $(seq 1 "$ROUNDS"); do
  for name in rsock rsock-epoll rsock-nospin; do
    json=$("$BIN/rsock" stat --dir "$WORK/$name-cli-$r" --all --json 2>&1)
    rd=$(sed -n 's/.*"conns":{"rdma":\([0-9]*\),"tcp":\([0-9]*\).*/\1 \2/p' <<<"$json" | head -1)
    echo "conns cell=$name round=$r rdma=${rd% *} tcp=${rd#* }" >>"$data"
  done
done
pair_barrier end 600
