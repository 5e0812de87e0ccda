#!/usr/bin/env bash
# Where a connection per request's time goes, across the two-guest bed's wire (issue #24):
# node 1 runs nginx (master + 2 workers as nobody, a 4 KiB file), node 0 a Python client
# (bench/rdma/conn_phases.py) that makes N connections one after another, each a `GET` with
# `Connection: close` read to EOF, and prints the medians of socket(), connect(), the
# request to EOF and close(), per mode, twice; then, for the floor, N bare rdma_cm
# connections one after another, twice (examples/cm_churn: resolve, QP, handshake, teardown;
# no rsock). With DEBUG=1 it then makes N more HTTP ones with the shim's debug log at both
# ends and prints the medians of the setup steps it logs (the client's handshake, the
# request's wait at the worker's branch, the branch's answer).
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh --topology pair --timeout 900 -- env N=150 DEBUG=1 bench/rdma/conn-phases.sh
#   LINKS=1: nginx runs with RSOCK_LINKS=1 too, and each round adds a client on links
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
ROOT=$PWD
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
# shellcheck source=../../tests/rdma/fork/servers.sh
. tests/rdma/fork/servers.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "conn-phases: needs --topology pair" >&2; exit 2; }
B=$ROOT/target/release
SRV=$RDMA_VM_PEER
[ "$RDMA_VM_NODE" = 1 ] && SRV=$RDMA_VM_SELF
N=${N:-150}
ulimit -l unlimited
port=7901
PRE="env LD_PRELOAD=$B/librsock.so RSOCK_CONNECT_TIMEOUT_MS=5000"
# median FILE SED: the median of the numbers SED picks from FILE's lines.
median() { sed -n "$2" "$1" | sort -n | awk '{ a[NR] = $1 } END { print "n=" NR " median=" a[int(NR / 2) + 1] }'; }
if [ "$RDMA_VM_NODE" = 1 ]; then
  d=/tmp/conn-phases; rm -rf $d; mkdir -p $d/log && chmod 1777 $d/log
  nginx_conf "$d" "$SRV" "$port" off
  head -c 4096 /dev/urandom > "$d/www/4k.bin"; chmod 755 $d $d/www; chmod 644 $d/www/4k.bin
  lvl=info; [ "${DEBUG:-0}" = 1 ] && lvl=debug
  $PRE RSOCK_LINKS=${LINKS:-0} RSOCK_LOG=$d/log/srv.log RSOCK_LOG_LEVEL=$lvl nginx -p "$d" -c "$d/nginx.conf" -e "$d/nginx-error.log" &
  sp=$!
  timeout 600 "$B/examples/cm_churn" server "$SRV" $((port + 1)) --conns $((2 * N)) &
  cp=$!
  sleep 3 # the workers make their branches
  pair_signal up
  pair_wait done 600
  kill -QUIT "$(cat $d/nginx.pid)"; wait $sp
  wait $cp || echo "cm_churn server: exit $?"
  if [ "${DEBUG:-0}" = 1 ]; then
    cat $d/log/srv.log* > $d/srv.all
    echo "server: a request's wait at the branch (us) $(median $d/srv.all 's/.*answering a request that waited \([0-9]*\) us.*/\1/p')"
    echo "server: the branch's answer (us) $(median $d/srv.all 's/.*accepted, ring .* in \([0-9]*\)us.*/\1/p')"
  fi
  pair_barrier end 120
  exit 0
fi
pair_wait up 120 || exit 1
P=$ROOT/bench/rdma/conn_phases.py
for round in 1 2; do
  python3 "$P" "$SRV" "$port" "$N" "tcp (round $round)"
  $PRE python3 "$P" "$SRV" "$port" "$N" "rsock (round $round)"
  [ "${LINKS:-0}" = 1 ] && $PRE RSOCK_LINKS=1 python3 "$P" "$SRV" "$port" "$N" "links (round $round)"
done
for round in 1 2; do
  timeout 300 "$B/examples/cm_churn" client "$SRV" $((port + 1)) --conns "$N"
done
if [ "${DEBUG:-0}" = 1 ]; then
  $PRE RSOCK_LOG=/tmp/conn-phases-cli.log RSOCK_LOG_LEVEL=debug python3 "$P" "$SRV" "$port" "$N" "rsock, debug log"
  f=/tmp/conn-phases-cli.log
  echo "client: connect in the shim (us) $(median $f 's/.*: connected in \([0-9]*\)us.*/\1/p')"
  echo "client: its handshake, REQ to REP (us) $(median $f 's/.*: connected in .* handshake \([0-9]*\)us.*/\1/p')"
fi
pair_signal done
pair_barrier end 120
