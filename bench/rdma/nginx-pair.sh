#!/usr/bin/env bash
# nginx across the two-guest bed's wire (issue #24): node 1 runs nginx (master + 2 workers
# as nobody, accept_mutex off, a 4 KiB file), node 0 runs `wrk -t 2 -c 8 -d 10s` with
# keep-alive and with `Connection: close` (a connection per request), for each mode in
# turn, twice, in one boot. Prints one line per run (req/s, wrk's errors) and each rsock
# client's counters. Node 1 has its two vCPUs for nginx alone, as a server host would.
#
# MODES (environment), default "tcp rsock links": tcp (no preload), rsock (the defaults: a
# QP per connection, set up in the worker's branch), links (RSOCK_LINKS=1 at both ends:
# links redirected to the workers' branches), rsock-b and links-b (the same with the
# library SO_B names, for an A/B of two builds in one boot).
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh --topology pair --timeout 1800 -- bench/rdma/nginx-pair.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
ROOT=$PWD
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
# shellcheck source=../../tests/rdma/fork/servers.sh
. tests/rdma/fork/servers.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "nginx-pair: needs --topology pair" >&2; exit 2; }
B=$ROOT/target/release
SRV=$RDMA_VM_PEER # node 0's view; node 1 listens on its own address
[ "$RDMA_VM_NODE" = 1 ] && SRV=$RDMA_VM_SELF
WRK_D=${WRK_D:-10s}
ulimit -l unlimited
ulimit -n 65536 2>/dev/null || true

# mode_env MODE STATS_DIR: the env command that runs a program in MODE.
mode_env() {
  local so=$B/librsock.so extra=
  case $1 in
    tcp) echo env; return ;;
    links) extra=RSOCK_LINKS=1 ;;
    rsock-b) so=${SO_B:?rsock-b needs SO_B} ;;
    links-b) extra=RSOCK_LINKS=1 so=${SO_B:?links-b needs SO_B} ;;
  esac
  mkdir -p "$2" && chmod 1777 "$2" # the workers (nobody) write their stats there
  echo env LD_PRELOAD="$so" RSOCK_STATS_DIR="$2" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=5000 $extra
}

run=0
one() { # MODE [close]
  local mode=$1 close=${2:-} hdr=()
  [ -n "$close" ] && hdr=(-H "Connection: close")
  run=$((run + 1))
  local port=$((7800 + run)) d=/tmp/ng-$run st=/tmp/st-$mode-$run
  if [ "$RDMA_VM_NODE" = 1 ]; then
    rm -rf "$d"; mkdir -p "$d"
    nginx_conf "$d" "$SRV" "$port" off
    head -c 4096 /dev/urandom > "$d/www/4k.bin"
    chmod 755 "$d" "$d/www" && chmod 644 "$d/www/4k.bin"
    $(mode_env "$mode" "$st-srv") nginx -p "$d" -c "$d/nginx.conf" -e "$d/nginx-error.log" &
    local sp=$!
    sleep 3 # the workers wait on the listener (and make their branches)
    pair_signal "up-$run"
    pair_wait "done-$run" 300
    kill -QUIT "$(cat "$d/nginx.pid" 2>/dev/null)" 2>/dev/null
    wait "$sp"
    return
  fi
  pair_wait "up-$run" 120 || exit 1
  $(mode_env "$mode" "$st") timeout 120 wrk -t 2 -c 8 -d "$WRK_D" --timeout 10s "${hdr[@]}" \
    "http://$SRV:$port/4k.bin" > /tmp/wrk.out 2>&1
  local rc=$?
  pair_signal "done-$run"
  printf '%-8s %-9s rc=%s %s req/s %s\n' "$mode" "${close:-keep}" "$rc" \
    "$(awk '/^Requests\/sec:/ { print $2 }' /tmp/wrk.out)" \
    "$(grep -E 'Socket errors|Non-2xx' /tmp/wrk.out | paste -sd' ')"
  [ "$mode" != tcp ] && env -u LD_PRELOAD "$B/rsock" stat --dir "$st" --all --json | python3 -c '
import sys, json
for l in sys.stdin:
    if l.strip():
        p = json.loads(l); print("     ", p["comm"], "conns", p["conns"], "links", p.get("links"), "branches", p.get("branches"))'
  return 0
}

for rep in 1 2; do
  for close in "" close; do
    for mode in ${MODES:-tcp rsock links}; do one "$mode" $close; done
  done
done
pair_barrier end 600
