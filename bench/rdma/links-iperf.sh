#!/usr/bin/env bash
# One connection's (and four's) throughput: iperf3 -t 5 for kernel TCP, rsock with a queue
# pair per connection and rsock on links, in turn, twice, in one boot. Across the two-guest
# bed's wire (`--topology pair`: node 1 serves, node 0 connects) or within one guest.
# Prints Gbit/s per run with each end's counters (conns, links, grown buffers; node 1's
# lines are the server's).
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh --topology pair --timeout 1000 -- bench/rdma/links-iperf.sh
#   tests/rdma-vm/run.sh --timeout 1000 -- bench/rdma/links-iperf.sh
#   MODES="nolinks links" PARS="1" ... (the modes and stream counts compared)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
rdma_vm_require_guest
B=$PWD/target/release
PAIR=0 SRV=$RDMA_VM_ADDR
if [ "${RDMA_VM_TOPOLOGY:-}" = pair ]; then
  PAIR=1 SRV=$RDMA_VM_PEER
  [ "$RDMA_VM_NODE" = 1 ] && SRV=$RDMA_VM_SELF
fi
ulimit -l unlimited
. bench/rdma/links-lib.sh

# grown DIR: each process's grown buffers, from its stats region.
grown() {
  env -u LD_PRELOAD "$B/rsock" stat --dir "$1" --all --json | python3 -c '
import sys, json
for l in sys.stdin:
    if l.strip():
        p = json.loads(l); print(p["comm"], "conns", p["conns"], "links", p.get("links"), "grown", p.get("grown"))'
}

# server MODE DIR PORT: iperf3's server for one connection, in the background.
server() {
  $(links_env "$1" "$2" 20000) timeout 60 iperf3 -s -1 -p "$3" > /tmp/srv.out 2>&1 &
  sp=$!
  sleep 1
}

run=0
for rep in 1 2; do
  for par in ${PARS:-1 4}; do
    for mode in ${MODES:-tcp nolinks links}; do
      run=$((run + 1))
      port=$((5300 + run)) d=/tmp/tput-$mode-$run
      rm -rf "$d"; mkdir -p "$d/srv" "$d/cli"
      if [ "$PAIR" = 1 ] && [ "$RDMA_VM_NODE" = 1 ]; then
        server "$mode" "$d/srv" "$port"
        pair_signal "up-$run"
        wait "$sp"
        pair_wait "done-$run" 120
        [ "$mode" != tcp ] && grown "$d/srv" | sed 's/^/  server: /'
        continue
      fi
      if [ "$PAIR" = 1 ]; then
        pair_wait "up-$run" 120 || exit 1
      else
        server "$mode" "$d/srv" "$port"
      fi
      out=$($(links_env "$mode" "$d/cli" 20000) timeout 60 iperf3 -c "$SRV" -p "$port" -t 5 -P "$par" -J 2>/dev/null)
      if [ "$PAIR" = 1 ]; then
        pair_signal "done-$run"
      else
        wait "$sp"
      fi
      g=$(python3 -c 'import json, sys; j = json.loads(sys.stdin.read()); print("%.3f" % (j["end"]["sum_received"]["bits_per_second"] / 1e9))' <<<"$out" 2>/dev/null)
      echo "rep=$rep streams=$par mode=$mode Gbit/s=${g:-failed}"
      [ "$mode" != tcp ] && grown "$d/cli" | sed 's/^/  client: /'
      [ "$mode" != tcp ] && [ "$PAIR" = 0 ] && grown "$d/srv" | sed 's/^/  server: /'
    done
  done
done
[ "$PAIR" = 1 ] && pair_barrier end 300
exit 0
