#!/usr/bin/env bash
# Benchmark of servers that fork (issue #9), rsock against kernel TCP in ONE boot of the
# Soft-RoCE test bed (a separate script: bench/rdma/run.sh and guest.sh are unchanged):
#
#   pgbench   PostgreSQL + `pgbench -c 4 -j 2 -T 20` (select-write TPC-B), tps; ratio rsock/tcp;
#             and the same with `-C`: a new connection (a forked backend) per transaction
#   wrk       nginx, master + 2 workers (no `user` line: as nobody), `wrk -t 2 -c 8 -d 10s` on a
#             4 KiB file, req/s; ratio; and the same with `Connection: close` (a connection
#             per request; its socket errors and non-2xx answers are recorded)
#   handover  fork after accept: per connection, connect + send 1 byte + the answer from the
#             forked child (examples/fork_echo) against the same without fork (--mode nofork):
#             median µs of examples/fork_client --op ping; the fork's cost = difference
#
# rsock: server and client under librsock.so; every rsock client must show conns.rdma > 0 and
# conns.tcp == 0 in its stats, otherwise the figure is recorded as FAILED. tcp: no preload,
# the client in namespace "plain" (10.77.0.2 -> 10.77.0.1 across the veth pair, as
# bench/rdma/guest.sh does). Under emulation only ratios within one run mean anything.
#
#   bench/rdma/fork.sh [--smoke] [--out DIR] [--no-build]   on the host: builds, boots the bed
#   tests/rdma-vm/run.sh -- bench/rdma/fork.sh [--smoke] [--out DIR]   (what the host does)
#
# PATHS (environment): which paths to run, default "tcp rsock"; also "links" (rsock with
# RSOCK_LINKS=1), "relay" (rsock with RSOCK_TAKEOVER=0), "redirect" (RSOCK_REDIRECT=1, the
# default), "noredirect" (RSOCK_REDIRECT=0: prefork workers take every connection over) and
# "redirect-links" (redirects and links). Every path but tcp is rsock's.
# RUNS (environment): which measurements, default "pgbench pgbench-C wrk wrk-close handover".
#
# --smoke: seconds per measurement (pgbench -T 3, wrk -d 3s, 30 pings), no figures worth
# reading. --out: where data.txt, logs/ and summary.md go (inside the project; default
# .cache/rdma-bench-fork). Records in data.txt: `tps what=pgbench|pgbench-C path=P value=V`,
# `rps what=wrk|wrk-close path=P value=V errors=..`, `lat what=handover path=P fork=0|1 median_us=.. p90_us=..`,
# `fail what=.. text=..`. Exit status 0 if every measurement ran (rsock's over RDMA).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD

SMOKE=0 OUT=$ROOT/.cache/rdma-bench-fork BUILD=1
while (($#)); do
  case $1 in
    --smoke) SMOKE=1 ;;
    --out) OUT=${2:?}; shift ;;
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--smoke] [--out DIR] [--no-build]" >&2; exit 2 ;;
  esac
  shift
done

if [[ ${RDMA_VM:-} != 1 ]]; then
  # Host: build, then run this script in the guest.
  if ((BUILD)); then
    cargo build --release --workspace --lib --bins --examples >&2 || { echo "build failed" >&2; exit 1; }
  fi
  mkdir -p "$OUT"
  args=(--out "$OUT")
  ((SMOKE)) && args+=(--smoke)
  tests/rdma-vm/run.sh --timeout 3000 -- env PATHS="${PATHS:-tcp rsock}" RUNS="${RUNS:-}" bench/rdma/fork.sh "${args[@]}"
  rc=$?
  [[ -s $OUT/summary.md ]] && cat "$OUT/summary.md"
  exit "$rc"
fi

source tests/rdma-vm/lib.sh
source tests/rdma/fork/servers.sh
rdma_vm_require_guest
SO=${RSOCK_SO:-$ROOT/target/release/librsock.so}
RSOCK=${RSOCK_BIN:-$ROOT/target/release/rsock}
EX=${RSOCK_EXAMPLES:-$ROOT/target/release/examples}
A=$RDMA_VM_ADDR
for c in pgbench nginx wrk setpriv; do
  command -v "$c" >/dev/null || { echo "missing $c (scripts/setup.sh installs it)" >&2; exit 2; }
done
for f in "$SO" "$RSOCK" "$EX/fork_echo" "$EX/fork_client"; do
  [[ -e $f ]] || { echo "missing $f (cargo build --release --workspace --lib --bins --examples)" >&2; exit 2; }
done
ulimit -l unlimited
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/logs
rm -rf "$LOGS" "$OUT/stats"
mkdir -p "$LOGS" "$OUT/stats"
DATA=$OUT/data.txt
: >"$DATA"
FAILS=0
W=/tmp/rsock-bench-fork   # postgres data and nginx prefix (guest tmpfs)
rm -rf "$W" && mkdir -p "$W" && chmod 755 "$W"
if ((SMOKE)); then PG_T=3 WRK_D=3s PINGS=30; else PG_T=20 WRK_D=10s PINGS=300; fi

say() { printf '[%6.1fs] %s\n' "$SECONDS" "$*"; }
rec() { echo "$*" >>"$DATA"; }
fail() { FAILS=$((FAILS + 1)); rec "fail what=$1 text=${2//$'\n'/ }"; say "FAIL $1: $2"; }

BG=()
start_bg() { # LOG CMD...: in its own session; sets BG_PID
  local log=$1; shift
  setsid "$@" </dev/null >"$log" 2>&1 &
  BG_PID=$!
  BG+=("$BG_PID")
}
stop_bg() {
  kill -TERM -- "-$1" 2>/dev/null
  local i
  for i in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() { local p; for p in "${BG[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done; }
trap cleanup EXIT

PORT=21000
next_port() { PORT=$((PORT + 1)); }

PATHS=${PATHS:-tcp rsock}
RUNS=${RUNS:-pgbench pgbench-C wrk wrk-close handover}
runs() { [[ " $RUNS " == *" $1 "* ]]; }
# env_for PATH STATSNAME: the preload environment of an rsock process (empty for tcp).
env_for() {
  local extra=
  case $1 in
    tcp) return 0 ;;
    links) extra=RSOCK_LINKS=1 ;;
    relay) extra=RSOCK_TAKEOVER=0 ;;
    redirect) extra=RSOCK_REDIRECT=1 ;;
    noredirect) extra=RSOCK_REDIRECT=0 ;;
    redirect-links) extra="RSOCK_REDIRECT=1 RSOCK_LINKS=1" ;;
  esac
  mkdir -p "$OUT/stats/$2" && chmod 1777 "$OUT/stats/$2" # sticky: the shim makes no stats in a dir others may write in otherwise
  echo env LD_PRELOAD="$SO" RSOCK_STATS_DIR="$OUT/stats/$2" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=5000 $extra
}
# client_pre PATH: tcp clients run in namespace plain.
client_pre() { [[ $1 == tcp ]] && echo in_plain; }

# check_rdma WHAT STATSNAME: every process there had conns.rdma > 0 and conns.tcp == 0.
check_rdma() {
  local json bad
  json=$("$RSOCK" stat --dir "$OUT/stats/$2" --all --json 2>&1)
  echo "$json" >"$OUT/stats/$2.json"
  bad=$(python3 - "$OUT/stats/$2.json" 2>&1 <<'PY'
import json, sys
ps = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
bad = [p for p in ps if p["conns"]["rdma"] == 0 or p["conns"]["tcp"] > 0]
if not ps:
    print("no process with stats")
for p in bad:
    print("pid %s %s conns %s" % (p["pid"], p["comm"], p["conns"]))
PY
  ) || bad="checker failed: $bad"
  if [[ -n $bad ]]; then fail "$1" "not over RDMA: $bad"; return 1; fi
}

# ---- pgbench --------------------------------------------------------------------------------

pgbench_run() { # PATH [-C]
  local path=$1 per_tx=${2:-} envs=() pre=() what=pgbench
  [[ -n $per_tx ]] && what=pgbench-C
  local log=$LOGS/$what-$path d=$W/$what-$path
  next_port
  pg_init "$d" || { fail "$what-$path" "initdb: $(tail -c 300 "$d/initdb.out")"; return; }
  read -ra envs <<<"$(env_for "$path" "$what-srv-$path")"
  # shellcheck disable=SC2046 # pg_server_args prints words
  start_bg "$log-srv.log" "${envs[@]}" setpriv --reuid=postgres --regid=postgres --init-groups \
    "$(pg_bin)/postgres" $(pg_server_args "$d" "$A" "$PORT")
  local srv=$BG_PID
  wait_tcp_listen "$PORT" 60 || { fail "$what-$path" "postgres did not listen: $(tail -c 300 "$log-srv.log")"; stop_bg "$srv"; return; }
  read -ra envs <<<"$(env_for "$path" "$what-cli-$path")"
  read -ra pre <<<"$(client_pre "$path")"
  local pg=(-h "$A" -p "$PORT" -U postgres)
  if ! "${pre[@]}" timeout 300 "${envs[@]}" pgbench -i -s 1 "${pg[@]}" postgres >"$log-init.log" 2>&1; then
    fail "$what-$path" "pgbench -i: $(tail -c 300 "$log-init.log" | tr '\n' ' ')"; stop_bg "$srv"; return
  fi
  if ! "${pre[@]}" timeout 300 "${envs[@]}" pgbench $per_tx -c 4 -j 2 -T "$PG_T" "${pg[@]}" postgres >"$log.log" 2>&1; then
    fail "$what-$path" "pgbench $per_tx -c 4: $(tail -c 300 "$log.log" | tr '\n' ' ')"; stop_bg "$srv"; return
  fi
  stop_bg "$srv"
  local tps failed
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$log.log" | head -n1)
  failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$log.log")
  [[ ${failed:-0} == 0 ]] || fail "$what-$path" "$failed failed transactions"
  [[ -n $tps ]] || { fail "$what-$path" "no tps line"; return; }
  if [[ $path != tcp ]]; then check_rdma "$what-$path" "$what-cli-$path" || return; fi
  rec "tps what=$what path=$path value=$tps"
  say "  $what $path: $tps tps"
}

# ---- wrk + nginx ----------------------------------------------------------------------------

wrk_run() { # PATH [close]
  local path=$1 close=${2:-} envs=() pre=() what=wrk hdr=()
  [[ -n $close ]] && what=wrk-close hdr=(-H "Connection: close")
  local log=$LOGS/$what-$path d=$W/nginx-$what-$path
  next_port
  mkdir -p "$d"
  nginx_conf "$d" "$A" "$PORT" off
  head -c 4096 /dev/urandom >"$d/www/4k.bin"
  read -ra envs <<<"$(env_for "$path" "nginx-$what-$path")"
  start_bg "$log-nginx.log" "${envs[@]}" nginx -p "$d" -c "$d/nginx.conf" -e "$d/nginx-error.log"
  local srv=$BG_PID
  wait_tcp_listen "$PORT" 60 || { fail "$what-$path" "nginx did not listen: $(tail -c 300 "$d/nginx-error.log")"; stop_bg "$srv"; return; }
  read -ra envs <<<"$(env_for "$path" "$what-$path")"
  read -ra pre <<<"$(client_pre "$path")"
  "${pre[@]}" timeout 120 "${envs[@]}" wrk -t 2 -c 8 -d "$WRK_D" --timeout 10s "${hdr[@]}" "http://$A:$PORT/4k.bin" >"$log.log" 2>&1
  local rc=$?
  stop_bg "$srv"
  local rps errs
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$log.log")
  errs=$(grep -E 'Socket errors|Non-2xx' "$log.log" | tr '\n' ' ')
  if ((rc != 0)) || [[ -z $rps ]] || [[ ${rps%.*} -eq 0 ]]; then
    fail "$what-$path" "wrk status $rc, ${rps:-no} req/s: $(tail -n 4 "$log.log" | tr '\n' ' ') nginx: $(grep -m2 -E '\[(alert|error)\]' "$d/nginx-error.log" | tr '\n' ' ')"
    return
  fi
  [[ -z $errs ]] || say "  $what $path: $errs"
  if [[ $path != tcp ]]; then check_rdma "$what-$path" "$what-$path" || return; fi
  rec "rps what=$what path=$path value=$rps errors=${errs// /_}"
  say "  $what $path: $rps req/s"
}

# ---- fork handover latency --------------------------------------------------------------------

handover_run() { # PATH FORK(0|1)
  local path=$1 fork=$2 envs=() pre=() log=$LOGS/handover-$1-$2 mode=fork
  ((fork)) || mode=nofork
  next_port
  read -ra envs <<<"$(env_for "$path" "ho-srv-$mode-$path")"
  start_bg "$log-srv.log" "${envs[@]}" "$EX/fork_echo" "$A:$PORT" --mode "$mode" --max-conns "$PINGS" --timeout 30
  local srv=$BG_PID
  wait_tcp_listen "$PORT" 60 || { fail "handover-$path-$mode" "server did not listen"; stop_bg "$srv"; return; }
  read -ra envs <<<"$(env_for "$path" "ho-cli-$mode-$path")"
  read -ra pre <<<"$(client_pre "$path")"
  "${pre[@]}" timeout 600 "${envs[@]}" "$EX/fork_client" "$A:$PORT" --op ping --conns "$PINGS" --timeout 30 >"$log.log" 2>&1
  local rc=$?
  stop_bg "$srv"
  local line
  line=$(grep '^ping ' "$log.log")
  if ((rc != 0)) || [[ -z $line ]]; then
    fail "handover-$path-$mode" "fork_client status $rc: $(grep -m3 -E 'FAIL|^ping' "$log.log" | tr '\n' ' ')"
    return
  fi
  if [[ $path != tcp ]]; then check_rdma "handover-$path-$mode" "ho-cli-$mode-$path" || return; fi
  local med p90
  med=$(sed -n 's/.* median_us=\([0-9]*\).*/\1/p' <<<"$line")
  p90=$(sed -n 's/.* p90_us=\([0-9]*\).*/\1/p' <<<"$line")
  rec "lat what=handover path=$path fork=$fork median_us=$med p90_us=$p90"
  say "  handover $path $mode: median $med us, p90 $p90 us"
}

# ---- run ------------------------------------------------------------------------------------

say "fork bench ($([[ $SMOKE == 1 ]] && echo smoke || echo full)); shim $(sha256sum "$SO" | cut -c1-16)"
for p in $PATHS; do
  runs pgbench && { say "pgbench $p"; pgbench_run "$p"; }
  runs pgbench-C && { say "pgbench -C $p"; pgbench_run "$p" -C; }
  runs wrk && { say "wrk + nginx $p"; wrk_run "$p"; }
  runs wrk-close && { say "wrk + nginx, Connection: close, $p"; wrk_run "$p" close; }
  if runs handover; then for f in 0 1; do handover_run "$p" "$f"; done; fi
done

# summary.md: the figures and their ratios.
python3 - "$DATA" "$OUT/summary.md" "$SMOKE" $PATHS <<'PY'
import sys
recs = []
for line in open(sys.argv[1]):
    kind, *kv = line.split()
    d = dict(x.split("=", 1) for x in kv if "=" in x)
    d["kind"] = kind
    recs.append(d)
paths = sys.argv[4:]
def get(kind, what, path, **kw):
    for r in recs:
        if r["kind"] == kind and r.get("what") == what and r.get("path") == path and all(r.get(k) == v for k, v in kw.items()):
            return float(r.get("value", r.get("median_us", "nan")))
    return None
def fmt(x):
    return "-" if x is None else f"{x:,.0f}"
def cell(x, tcp, p):
    if x is None:
        return "-"
    return fmt(x) + (f" ({x / tcp:.2f}×)" if tcp and p != "tcp" else "")
rows = [
    ("pgbench -c 4 (tps)", lambda p: get("tps", "pgbench", p)),
    ("pgbench -C -c 4, a connection per transaction (tps)", lambda p: get("tps", "pgbench-C", p)),
    ("wrk → nginx 2 workers, 4 KiB (req/s)", lambda p: get("rps", "wrk", p)),
    ("the same, `Connection: close`: a connection per request (req/s)", lambda p: get("rps", "wrk-close", p)),
    ("connect + 1-byte answer, no fork (median µs)", lambda p: get("lat", "handover", p, fork="0")),
    ("connect + answer from the forked child (median µs)", lambda p: get("lat", "handover", p, fork="1")),
]
def handover(p):
    a, b = get("lat", "handover", p, fork="0"), get("lat", "handover", p, fork="1")
    return None if a is None or b is None else b - a
rows.append(("cost of the fork hand-over (µs, difference of the medians)", handover))
out = ["# Fork benchmark (one boot; in brackets: the ratio to kernel TCP)" + (" — smoke run, figures not meaningful" if sys.argv[3] == "1" else ""), "",
       "| measurement | " + " | ".join(paths) + " |", "|---|" + "---:|" * len(paths)]
for name, f in rows:
    tcp = f("tcp") if "tcp" in paths else None
    out.append(f"| {name} | " + " | ".join(cell(f(p), tcp, p) for p in paths) + " |")
fails = [l.strip() for l in open(sys.argv[1]) if l.startswith("fail ")]
if fails:
    out += ["", "Failed measurements:", ""] + [f"- {f[5:]}" for f in fails]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
cat "$OUT/summary.md"
if ((FAILS)); then
  echo "fork bench: $FAILS measurement(s) FAILED"
  exit 1
fi
echo "fork bench: all measurements ran; rsock's went over RDMA"
