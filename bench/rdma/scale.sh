#!/usr/bin/env bash
# Scale benchmark (issue #12): N concurrent connections between two processes, rsock against
# kernel TCP, in ONE boot of the Soft-RoCE test bed. For each N: setup rate (connect + a byte
# each way, 16 connecting threads), pinned memory per connection (VmPin of both processes),
# RC QPs per connection (`rdma resource show qp`), 64 B round trip on one connection while
# all N are open. Also sequential setup (1 thread), with connections kept open and with each
# closed at once (churn). Client and server: examples/scale_conns. See docs/BENCHMARKS.md.
#
#   bench/rdma/scale.sh                 N = 100 1000 10000; writes bench/rdma/results/scale.md
#   bench/rdma/scale.sh --n "100 1000"  other sizes (results go to .cache/rdma-scale/ unless
#                                       the list is the default)
#
# Options: --mem MIB (guest memory, default 6144: 10,000 connections pin ~640 MB and their
# QPs take about as much kernel memory), --no-build.
# rsock runs at its defaults: rings and send buffers start at 16 KiB (RSOCK_BUF_START) and
# grow to 256 KiB only under a stream, which these connections never carry. Sequential setup
# is also measured with buffers fixed at 256 KiB (RSOCK_BUF_START=262144: what every
# connection pinned before buffers grew).
# Exit status: 0 = every measurement ran and rsock's connections were all on RDMA.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD

if [[ ${1:-} == --in-guest ]]; then
  shift
  OUT=$1 NS=$2
  BIN=$OUT/bin
  A=${RDMA_VM_ADDR:-10.77.0.1}
  ulimit -n 1048576 2>/dev/null || ulimit -n 65536
  ulimit -l unlimited
  PORT=7600
  fails=0
  # one LABEL N PAR CLOSE [VAR=VALUE...]: a server and a client; appends the client's JSON.
  one() {
    local label=$1 n=$2 par=$3 close=$4
    shift 4
    local env=(env "$@")
    [[ $label == tcp ]] || env+=(LD_PRELOAD="$BIN/librsock.so" RSOCK_CONNECT_TIMEOUT_MS=60000
      RSOCK_STATS_DIR="$OUT/stats-$PORT" RSOCK_STATS_KEEP=1 RSOCK_LOG="$OUT/log-$PORT")
    rm -rf "$OUT/stats-$PORT" "$OUT/log-$PORT"
    "${env[@]}" "$BIN/scale_conns" server "$A:$PORT" "$n" >/dev/null 2>"$OUT/srv.err" &
    local spid=$! i
    for i in $(seq 1 100); do ss -Hltn "sport = :$PORT" | grep -q . && break; sleep 0.1; done
    [[ $label == tcp ]] || for i in $(seq 1 100); do
      rdma resource show cm_id 2>/dev/null | grep -qE "state LISTEN .*src-addr [^ ]*:$PORT( |\$)" && break
      sleep 0.1
    done
    local line
    line=$(timeout 1800 "${env[@]}" "$BIN/scale_conns" client "$A:$PORT" "$n" --par "$par" \
      --close-each "$close" --rtt 1000 --server-pid "$spid" 2>"$OUT/cli.err" | grep '^{' | tail -n1)
    timeout 120 tail --pid="$spid" -f /dev/null || kill -9 "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    local rdma=""
    if [[ $label != tcp ]]; then
      rdma=$("$BIN/rsock" stat --dir "$OUT/stats-$PORT" --all --json 2>/dev/null |
        python3 -c 'import json,sys; print(sum(json.loads(l)["conns"]["rdma"] for l in sys.stdin if l.strip()))')
    fi
    echo "{\"label\": \"$label\", \"close_each\": $close, \"rdma_conns_both_ends\": ${rdma:-null}, \"client\": ${line:-null}}" >>"$OUT/scale.jsonl"
    echo "scale: $label n=$n par=$par close=$close: ${line:-FAILED: $(tail -c 300 "$OUT/cli.err")}" >&2
    if [[ -z $line ]] || ! grep -q '"ok": true' <<<"$line" ||
      { [[ $label != tcp ]] && [[ ${rdma:-0} != $((2 * n)) ]]; }; then
      fails=$((fails + 1))
    fi
    PORT=$((PORT + 1))
  }
  for close in 0 1; do
    one tcp 200 1 $close
    one rsock 200 1 $close
    one rsock-256k 200 1 $close RSOCK_BUF_START=262144
  done
  for n in $NS; do
    one tcp "$n" 16 0
    one rsock "$n" 16 0
  done
  exit $((fails > 0))
fi

NS="100 1000 10000" MEM=6144 BUILD=1
while (($#)); do
  case $1 in
    --n) NS=${2:?}; shift ;;
    --mem) MEM=${2:?}; shift ;;
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--n \"N...\"] [--mem MIB] [--no-build]" >&2; exit 2 ;;
  esac
  shift
done
if [[ $NS == "100 1000 10000" ]]; then OUT=$ROOT/bench/rdma/results/scale-raw; else OUT=$ROOT/.cache/rdma-scale; fi
log() { printf 'scale-bench: %s\n' "$*" >&2; }
if ((BUILD)); then
  cargo build --release >&2 && cargo build --release --workspace --bins --examples >&2 || { log "build failed"; exit 1; }
fi
rm -rf "$OUT"
mkdir -p "$OUT/bin"
for f in librsock.so rsock examples/scale_conns; do
  cp "$ROOT/target/release/$f" "$OUT/bin/" || { log "missing target/release/$f"; exit 2; }
done
tests/rdma-vm/setup.sh >&2 || { log "test bed setup failed"; exit 97; }
{
  echo "date_utc=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src preload examples 2>/dev/null || echo ' + uncommitted changes')"
  echo "host_cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "vm=TCG, 2 vCPU, $MEM MiB"
} >"$OUT/host.txt"
rc=0
tests/rdma-vm/run.sh --timeout 5400 --mem "$MEM" -- bench/rdma/scale.sh --in-guest "$OUT" "$NS" || rc=$?
[[ -s $OUT/scale.jsonl ]] || { log "no data (status $rc)"; exit "$((rc ? rc : 1))"; }
python3 - "$OUT" >"$OUT/scale.md" <<'PY'
import json, sys
out = sys.argv[1]
host = dict(l.strip().split("=", 1) for l in open(f"{out}/host.txt") if "=" in l)
rows = [json.loads(l) for l in open(f"{out}/scale.jsonl") if l.strip()]
print(f"# Scale benchmark, {host.get('date_utc')}, commit {host.get('commit')}\n")
print(f"Soft-RoCE guest ({host.get('vm')}) on {host.get('host_cpu')}. `bench/rdma/scale.sh`; raw data in `scale-raw/`.")
print("rsock = the defaults (16 KiB ring + 16 KiB send buffer, growing to 256 KiB under a stream); rsock-256k = buffers fixed at 256 KiB (RSOCK_BUF_START=262144).\n")
def tcp_of(r):
    for t in rows:
        c, d = t["client"], r["client"]
        if t["label"] == "tcp" and c and d and c["n"] == d["n"] and c["par"] == d["par"] and t["close_each"] == r["close_each"]:
            return c
def fmt(v, f="{:.1f}"):
    return "-" if v is None else f.format(v)
print("## Setup rate (connect + accept + a byte each way)\n")
print("| N | threads | connections | path | setups/s | vs TCP | busy CPU ms per setup, whole guest (user) | connect p50 ms | p99 ms | RDMA conns (both ends) |")
print("|--:|--:|---|---|--:|--:|--:|--:|--:|--:|")
for r in rows:
    c = r["client"]
    if not c:
        print(f"| ? | ? | {'closed' if r['close_each'] else 'kept'} | {r['label']} | FAILED | | | | | |")
        continue
    t = tcp_of(r)
    ratio = c["setup_per_s"] / t["setup_per_s"] if t and r["label"] != "tcp" and t["setup_per_s"] else None
    print(f"| {c['n']} | {c['par']} | {'closed' if r['close_each'] else 'kept open'} | {r['label']} | {c['setup_per_s']:.0f} | "
          f"{fmt(ratio, '{:.2f}x')} | {fmt(c.get('cpu_ms_per_setup'), '{:.2f}')} ({fmt(c.get('user_cpu_ms_per_setup'), '{:.2f}')}) | {c['connect_ms_p50']:.2f} | {c['connect_ms_p99']:.2f} | {fmt(r['rdma_conns_both_ends'], '{}')} |")
print("\n## With all N open\n")
print("| N | path | pinned KiB per connection (client / server) | RC QPs per connection (both ends, one host) | 64 B RTT p50 µs | p99 µs | verified |")
print("|--:|---|--:|--:|--:|--:|--:|")
for r in rows:
    c = r["client"]
    if not c or r["close_each"] or c["par"] == 1:
        continue
    n = c["n"]
    print(f"| {n} | {r['label']} | {c['cli_vmpin_kib'] / n:.1f} / {c['srv_vmpin_kib'] / n:.1f} | {c['rc_qps'] / n:.2f} | "
          f"{c['rtt_us_p50']:.1f} | {c['rtt_us_p99']:.1f} | {c['verified']}/{n} |")
PY
cat "$OUT/scale.md"
[[ $OUT == "$ROOT/bench/rdma/results/scale-raw" ]] && cp "$OUT/scale.md" bench/rdma/results/scale.md
exit "$rc"
