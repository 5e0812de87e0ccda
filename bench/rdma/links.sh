#!/usr/bin/env bash
# Links (issue #24): connection churn (400 connections one after another, and from 16
# threads, each closed after a byte each way) and a 64 B round trip on one of 20 open
# connections, for kernel TCP, rsock with a QP per connection and rsock on links
# (RSOCK_LINKS=1), in turn, twice, in one boot of the Soft-RoCE bed. Prints one line per run
# (examples/scale_conns' JSON, summarised) and each rsock process's counters.
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh -- bench/rdma/links.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
B=$PWD/target/release; E=$B/examples
A=${RDMA_VM_ADDR:-10.77.0.1}
N=400
ulimit -l unlimited
port=7700
. bench/rdma/links-lib.sh
one() { # MODE PAR [keep] EXTRA...
  local mode=$1 par=$2; shift 2
  port=$((port+1))
  local d=/tmp/st-$mode-$port n=$N rc
  rm -rf "$d"; mkdir -p "$d"
  [ "${1:-}" = keep ] && { n=20; shift; }
  $(links_env "$mode" "$d" 10000) timeout 120 "$E/scale_conns" server "$A:$port" "$n" > /tmp/srv.out 2>&1 &
  local sp=$!
  sleep 1
  $(links_env "$mode" "$d" 10000) timeout 120 "$E/scale_conns" client "$A:$port" "$n" --par "$par" "$@" > /tmp/cli.out 2>&1
  rc=$?
  wait "$sp"
  links_report "$mode" "$par" "$rc" "$d" "$@"
}
links_plan
