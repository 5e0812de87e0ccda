#!/usr/bin/env bash
# Guest side of bench/rdma/profile.sh: where the user-space instructions of one round trip
# go, counted by callgrind (exact counts: the guest has no PMU for perf to sample). Runs in
# one guest (topology plain); the server is not profiled, the client is.
#
# Each cell runs the client twice, with SMALL and LARGE round trips; the difference,
# divided by LARGE - SMALL, is the cost of one round trip without the process's start,
# the device's opening and the connection's set-up. Waits do not poll
# (RSOCK_SPIN_US=0): a poll's instructions measure the waiting, not the work.
#
#   bench/rdma/profile-guest.sh --out DIR
# Writes DIR/CELL-N.cg (callgrind's files) for N in SMALL, LARGE, and DIR/runs.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
rdma_vm_require_guest

OUT=
while (($#)); do
  case $1 in
    --out) OUT=${2:?}; shift ;;
    *) echo "usage: $0 --out DIR" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OUT" ] || { echo "--out is required" >&2; exit 2; }
BIN=${BENCH_BIN:?BENCH_BIN (the copied binaries) must be set}
SMALL=100 LARGE=400 SIZE=64
mkdir -p "$OUT"
: >"$OUT/runs.txt"
WORK=$(mktemp -d /tmp/rsock-profile.XXXXXX)
A=$RDMA_VM_ADDR

shim() { # NAME CMD...: with the shim preloaded, waits not polling
  local name=$1; shift
  env LD_PRELOAD="$BIN/librsock.so" RSOCK_SPIN_US=0 RSOCK_STATS_DIR="$WORK/$name" RSOCK_STATS_KEEP=1 \
    RSOCK_LOG="$WORK/$name.log" "$@"
}
cg() { # NAME N [in_plain] [VAR=VALUE...] CMD...: CMD under callgrind into OUT/NAME-N.cg
  local name=$1 n=$2 pre=() vars=(); shift 2
  [ "$1" = in_plain ] && { pre=(in_plain); shift; }
  while [[ $1 == *=* ]]; do vars+=("$1"); shift; done
  "${pre[@]}" env "${vars[@]}" valgrind --tool=callgrind --callgrind-out-file="$OUT/$name-$n.cg" "$@" >"$WORK/$name-$n.out" 2>&1
}
shim_vars() { # NAME: the shim's variables for a profiled process
  echo "LD_PRELOAD=$BIN/librsock.so RSOCK_SPIN_US=0 RSOCK_STATS_DIR=$WORK/$1 RSOCK_STATS_KEEP=1 RSOCK_LOG=$WORK/$1.log"
}
rc=0
port=7700
for cell in rsock rsock-epoll tcp-epoll send_lat_e; do
  for n in $SMALL $LARGE; do
    port=$((port + 1))
    epoll=(); case $cell in *-epoll) epoll=(--epoll) ;; esac
    case $cell in
      rsock*)
        shim "$cell-srv-$n" "$BIN/pingpong" server "$A:$port" --once "${epoll[@]}" >"$WORK/srv.out" 2>&1 &
        wait_tcp_listen $port 60
        # shellcheck disable=SC2046 # shim_vars prints words
        cg "$cell" "$n" $(shim_vars "$cell-$n") "$BIN/pingpong" client "$A:$port" --size $SIZE --iters "$n" --warmup 0 "${epoll[@]}"
        ;;
      tcp*)
        "$BIN/pingpong" server "$A:$port" --once "${epoll[@]}" >"$WORK/srv.out" 2>&1 &
        wait_tcp_listen $port 60
        # Across the veth pair, as the bench's TCP cells are measured.
        cg "$cell" "$n" in_plain "$BIN/pingpong" client "$A:$port" --size $SIZE --iters "$n" --warmup 0 "${epoll[@]}"
        ;;
      send_lat_e)
        timeout 300 ib_send_lat -d rxe0 -e -s $SIZE -n "$n" >"$WORK/srv.out" 2>&1 &
        sleep 2
        cg "$cell" "$n" ib_send_lat -d rxe0 -e -s $SIZE -n "$n" "$A"
        ;;
    esac
    st=$?
    wait
    [ $st = 0 ] || { echo "profile-guest: $cell $n failed (status $st): $(tail -c 300 "$WORK/$cell-$n.out")" >&2; rc=1; }
    echo "run cell=$cell n=$n status=$st" >>"$OUT/runs.txt"
  done
  case $cell in
    rsock*) # the profile counts only if the connection was RDMA
      json=$("$BIN/rsock" stat --dir "$WORK/$cell-$LARGE" --all --json 2>&1)
      rd=$(sed -n 's/.*"conns":{"rdma":\([0-9]*\),"tcp":\([0-9]*\).*/\1 \2/p' <<<"$json" | head -1)
      echo "conns cell=$cell rdma=${rd% *} tcp=${rd#* }" >>"$OUT/runs.txt"
      ;;
  esac
done
# Syscalls per round trip of the epoll-driven client (strace -f, every thread, between
# pingpong's two getrusage calls around its timed round trips), for this shim and, if
# BASE_BIN names another build's directory, for that one: what a change to the waits saved.
strace_cell() { # NAME SHIM_DIR
  local name=$1 dir=$2 n=300
  port=$((port + 1))
  shim "$name-srv" env LD_PRELOAD="$dir/librsock.so" "$BIN/pingpong" server "$A:$port" --once --epoll >"$WORK/srv.out" 2>&1 &
  wait_tcp_listen $port 60
  strace -f -qq -o "$OUT/strace-$name.txt" -E LD_PRELOAD="$dir/librsock.so" -E RSOCK_SPIN_US=0 \
    -E RSOCK_STATS_DIR="$WORK/$name" -E RSOCK_STATS_KEEP=1 \
    "$BIN/pingpong" client "$A:$port" --size $SIZE --iters $n --warmup 50 --epoll >"$WORK/$name.out" 2>&1 ||
    { echo "profile-guest: strace $name failed: $(tail -c 300 "$WORK/$name.out")" >&2; rc=1; }
  wait
  awk -v n=$n -v cell="$name" '
    { pid = $1; call = $2; sub(/\(.*/, "", call) }
    call == "getrusage" { g++; if (g == 1) { on = 1; next } if (g == 2) { on = 0 } }
    on && call ~ /^[a-z_0-9]+$/ { c[call]++; tot++ }
    END { for (k in c) printf "sys cell=%s syscall=%s per_rt=%.2f\n", cell, k, c[k] / n
          printf "sys cell=%s syscall=ALL per_rt=%.2f\n", cell, tot / n }' "$OUT/strace-$name.txt" >>"$OUT/runs.txt"
}
strace_cell rsock-epoll "$BIN"
[ -n "${BASE_BIN:-}" ] && strace_cell rsock-epoll-base "$BASE_BIN"
echo "rounds small=$SMALL large=$LARGE size=$SIZE" >>"$OUT/runs.txt"
exit $rc
