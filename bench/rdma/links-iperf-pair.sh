#!/usr/bin/env bash
# One connection's (and four's) throughput across the two-guest bed's wire: iperf3 -t 5,
# node 1 serves, node 0 connects, for kernel TCP, rsock with a queue pair per connection and
# rsock on links, in turn, twice, in one boot. Prints Gbit/s per run with the client's
# counters (conns, links, grown buffers) and the server's grown buffers (node 1's lines).
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh --topology pair --timeout 1000 -- bench/rdma/links-iperf-pair.sh
#   MODES="nolinks links" PARS="1" ... (the modes and stream counts compared)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "links-iperf-pair: needs --topology pair" >&2; exit 2; }
B=$PWD/target/release
SRV=$RDMA_VM_PEER
[ "$RDMA_VM_NODE" = 1 ] && SRV=$RDMA_VM_SELF
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

run=0
for rep in 1 2; do
  for par in ${PARS:-1 4}; do
    for mode in ${MODES:-tcp nolinks links}; do
      run=$((run + 1))
      port=$((5300 + run)) d=/tmp/tput-$mode-$run
      rm -rf "$d"; mkdir -p "$d"
      if [ "$RDMA_VM_NODE" = 1 ]; then
        $(links_env "$mode" "$d" 20000) timeout 60 iperf3 -s -1 -p "$port" > /tmp/srv.out 2>&1 &
        sp=$!
        sleep 1
        pair_signal "up-$run"
        wait "$sp"
        pair_wait "done-$run" 120
        [ "$mode" != tcp ] && grown "$d" | sed 's/^/  server: /'
        continue
      fi
      pair_wait "up-$run" 120 || exit 1
      out=$($(links_env "$mode" "$d" 20000) timeout 60 iperf3 -c "$SRV" -p "$port" -t 5 -P "$par" -J 2>/dev/null)
      pair_signal "done-$run"
      g=$(python3 -c 'import json, sys; j = json.loads(sys.stdin.read()); print("%.3f" % (j["end"]["sum_received"]["bits_per_second"] / 1e9))' <<<"$out" 2>/dev/null)
      echo "rep=$rep streams=$par mode=$mode Gbit/s=${g:-failed}"
      [ "$mode" != tcp ] && grown "$d" | sed 's/^/  client: /'
    done
  done
done
pair_barrier end 300
