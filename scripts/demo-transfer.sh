#!/usr/bin/env bash
# One nc.openbsd transfer of MiB random bytes with librsock.so preloaded on both ends,
# checked with sha256, followed by the shim's counters for each end and the RDMA device's
# counters. Called by scripts/demo.sh (on the host or inside the test bed).
#
#   scripts/demo-transfer.sh MiB ADDR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mib=$1 addr=$2 port=${RSOCK_DEMO_PORT:-7471}
so=$PWD/target/release/librsock.so cli=$PWD/target/release/rsock
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

rxe_counters() {  # "sent_pkts rcvd_pkts" of the first RDMA device, or "- -"
  local d; d=$(ls /sys/class/infiniband 2>/dev/null | head -n1)
  if [[ -z $d ]]; then echo "- -"; return; fi
  local c=/sys/class/infiniband/$d/ports/1/hw_counters
  echo "$(cat "$c/sent_pkts" 2>/dev/null || echo -) $(cat "$c/rcvd_pkts" 2>/dev/null || echo -)"
}

head -c $((mib << 20)) /dev/urandom >"$work/in"
export RSOCK_STATS_DIR=$work/stats RSOCK_STATS_KEEP=1 RSOCK_LOG=$work/rsock.log
before=$(rxe_counters)
LD_PRELOAD=$so nc -l -N "$addr" "$port" >"$work/out" &
for _ in $(seq 200); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.05; done
t0=$(date +%s.%N)
LD_PRELOAD=$so nc -N "$addr" "$port" <"$work/in"
wait
t1=$(date +%s.%N)
after=$(rxe_counters)

want=$(sha256sum <"$work/in" | cut -d' ' -f1) got=$(sha256sum <"$work/out" | cut -d' ' -f1)
echo
echo "transfer: $mib MiB with nc.openbsd, both ends under librsock.so, $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
if [[ $want == "$got" ]]; then echo "sha256:   $got (identical)"; else echo "sha256:   MISMATCH $want != $got"; fi
echo
"$cli" stat --dir "$RSOCK_STATS_DIR" --all
echo
read -r s0 r0 <<<"$before"; read -r s1 r1 <<<"$after"
if [[ $s0 == - ]]; then
  echo "RDMA device: none on this host"
else
  echo "RDMA device packets during the transfer: sent $((s1 - s0)), received $((r1 - r0))"
fi
paths=$("$cli" stat --dir "$RSOCK_STATS_DIR" --all --json |
  python3 -c 'import json,sys
seen=set()
for l in sys.stdin:
    p=json.loads(l)
    for k,v in p["conns"].items():
        if v: seen.add(k)
    for k,v in p["fallback"].items():
        if v: seen.add("fallback reason "+k)
print(", ".join(sorted(seen)) or "none")')
echo "path taken: $paths"
[[ $want == "$got" ]]
