#!/usr/bin/env bash
# Links (issue #24) across the two-guest bed's wire: node 1 serves, node 0 connects. The
# same churn and round trip as bench/rdma/links.sh (400 connections, each closed after a
# byte each way, one after another and from 16 threads; a 64 B round trip on one of 20 open
# connections), for kernel TCP, rsock with a QP per connection and rsock on links, in turn,
# twice, in one boot. Prints one line per run and each rsock client's counters.
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh --topology pair --timeout 1800 -- bench/rdma/links-pair.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "links-pair: needs --topology pair" >&2; exit 2; }
B=$PWD/target/release; E=$B/examples
N=${N:-400}
SRV=$RDMA_VM_PEER # node 0's view; node 1 listens on its own address
[ "$RDMA_VM_NODE" = 1 ] && SRV=$RDMA_VM_SELF
ulimit -l unlimited
ulimit -n 65536 2>/dev/null || true
. bench/rdma/links-lib.sh
run=0
one() { # MODE PAR [keep] EXTRA...
  local mode=$1 par=$2; shift 2
  run=$((run + 1))
  local port=$((7700 + run)) n=$N d=/tmp/st-$mode-$run
  [ "${1:-}" = keep ] && { n=20; shift; }
  rm -rf "$d"; mkdir -p "$d"
  if [ "$RDMA_VM_NODE" = 1 ]; then
    $(links_env "$mode" "$d" 20000) timeout 300 "$E/scale_conns" server "$SRV:$port" "$n" > /tmp/srv.out 2>&1 &
    local sp=$!
    sleep 2
    pair_signal "up-$run"
    wait "$sp"
    pair_wait "done-$run" 400
    return
  fi
  pair_wait "up-$run" 120 || exit 1
  $(links_env "$mode" "$d" 20000) timeout 300 "$E/scale_conns" client "$SRV:$port" "$n" --par "$par" "$@" > /tmp/cli.out 2>&1
  local rc=$?
  pair_signal "done-$run"
  links_report "$mode" "$par" "$rc" "$d" "$@"
}
links_plan
pair_barrier end 600
