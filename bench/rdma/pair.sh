#!/usr/bin/env bash
# Two-host latency benchmark: rsock against kernel TCP and raw verbs across the emulated
# wire of the two-guest bed (tests/rdma-vm/run.sh --topology pair), all in ONE boot; node 1
# serves, node 0 measures. This is the run of record for latency (docs/BENCHMARKS.md): in
# one guest rxe "sends" to itself and the wire costs nothing.
#
#   bench/rdma/pair.sh [--rounds N] [--iters N] [--no-build] [--out DIR]
#
# Writes bench/rdma/results/pair-latest.md (medians over the rounds, ratios within the
# boot, packets per round trip from rxe0's counters on node 0) and keeps the raw data in
# DIR (default bench/rdma/results/pair-raw). Exit status: 0 = every cell measured and
# every rsock connection went over RDMA; 1 = otherwise; 97/98 = test-bed failure/timeout.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
ROUNDS=3 ITERS=1000 BUILD=1 OUT=$ROOT/bench/rdma/results/pair-raw
while (($#)); do
  case $1 in
    --rounds) ROUNDS=${2:?}; shift ;;
    --iters) ITERS=${2:?}; shift ;;
    --no-build) BUILD=0 ;;
    --out) OUT=${2:?}; shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--rounds N] [--iters N] [--no-build] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
. bench/rdma/host-lib.sh
log() { printf 'pair-bench: %s\n' "$*" >&2; }
OUT=$(bench_out "$OUT") || exit 2
bench_bins "$OUT" "$BUILD" || exit $?
tests/rdma-vm/setup.sh >&2 || { log "test bed setup failed"; exit 97; }
# The real servers and their load tools (the guests run the host's installed programs).
need=()
for c in nginx:nginx-light wrk:wrk pgbench:postgresql redis-server:redis-server redis-benchmark:redis-tools \
  memcached:memcached memcslap:libmemcached-tools; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
    { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2; } ||
    log "could not install ${need[*]}: those servers will fail"
fi
{
  echo "date_utc=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src preload 2>/dev/null || echo ' + uncommitted changes')"
  echo "host_cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) CPUs"
  echo "host_load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/host.txt"
rc=0
tests/rdma-vm/run.sh --topology pair --timeout 3000 -e BENCH_BIN="$OUT/bin" -- \
  bench/rdma/pair-guest.sh --out "$OUT" --rounds "$ROUNDS" --iters "$ITERS" || rc=$?
((rc == 97 || rc == 98)) && exit $rc
[[ -s $OUT/data.txt ]] || { log "no data (status $rc)"; exit 1; }
python3 bench/rdma/pair_report.py "$OUT" >"$OUT/report.md" || { log "report failed"; exit 1; }
# Only a run into the default directory is the run of record.
[[ $OUT == "$ROOT/bench/rdma/results/pair-raw" ]] && cp "$OUT/report.md" bench/rdma/results/pair-latest.md
cat "$OUT/report.md"
grep -q '^FAILED' "$OUT/report.md" && exit 1
exit $rc
