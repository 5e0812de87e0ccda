#!/usr/bin/env bash
# Links (issue #24): connection churn (400 connections one after another, and from 16
# threads, each closed after a byte each way) and a 64 B round trip on one of 20 open
# connections, for kernel TCP, rsock with a QP per connection and rsock on links
# (RSOCK_LINKS=1), in turn, twice, in one boot of the Soft-RoCE bed. Prints one line per run
# (examples/scale_conns' JSON, summarised) and each rsock process's counters.
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh -- bench/rdma/links.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
B=$PWD/target/release; E=$B/examples
A=${RDMA_VM_ADDR:-10.77.0.1}
N=400
ulimit -l unlimited
port=7700
one() { # MODE PAR EXTRA...
  local mode=$1 par=$2; shift 2
  port=$((port+1))
  d=/tmp/st-$mode-$port; rm -rf $d; mkdir -p $d
  case $mode in
    tcp) pre=(env);;
    links) pre=(env LD_PRELOAD=$B/librsock.so RSOCK_LINKS=1 ${XENV:-} RSOCK_STATS_DIR=$d RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=10000);;
    nolinks) pre=(env LD_PRELOAD=$B/librsock.so RSOCK_STATS_DIR=$d RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=10000);;
  esac
  local n=$N; [ "$1" = keep ] && { n=20; shift; }
  "${pre[@]}" timeout 120 $E/scale_conns server $A:$port $n > /tmp/srv.out 2>&1 &
  sp=$!
  sleep 1
  "${pre[@]}" timeout 120 $E/scale_conns client $A:$port $n --par $par "$@" > /tmp/cli.out 2>&1
  rc=$?
  wait $sp
  python3 - "$mode" "$par" "$rc" "$*" <<'PY'
import json, sys
mode, par, rc, extra = sys.argv[1:]
j = json.loads([l for l in open('/tmp/cli.out') if l.startswith('{')][-1])
print(f"{mode:8} par={par:>2} {extra:18} rc={rc} ok={j['ok']} setup/s={j['setup_per_s']:8.1f} cpu_ms={j['cpu_ms_per_setup']:5.2f} connect_p50={j['connect_ms_p50']:6.2f} rtt_p50={j['rtt_us_p50']:8.1f} qps={j['rc_qps']}")
PY
  [ $mode != tcp ] && env -u LD_PRELOAD $B/rsock stat --dir $d --all --json | python3 -c '
import sys, json
for l in sys.stdin:
    if l.strip():
        p = json.loads(l); print("     ", p["comm"], "conns", p["conns"], "links", p.get("links"))'
}
for rep in 1 2; do
  for par in 1 16; do
    for mode in tcp nolinks links; do one $mode $par --close-each 1; done
  done
done
for mode in tcp nolinks links; do one $mode 1 keep --rtt 2000; done
