#!/usr/bin/env bash
# Guest side of the RDMA benchmark (bench/rdma/run.sh boots the test bed and runs this).
# Runs INSIDE an already booted test-bed guest (topology plain, the default), so the test
# suite can call it in its own boot:
#
#   tests/rdma-vm/run.sh -- bench/rdma/guest.sh [--smoke] [--runs N] [--out DIR]
#
# Measures, in this one guest on rxe0 (10.77.0.1):
#   verbs    perftest ib_write_lat -R / ib_write_bw -R              (the limit)
#   rsocket  rstream (rdma-core's rsocket), pingpong under librspreload (the peer)
#   tcp      pingpong and iperf3 without any preload, client in namespace "plain"
#            (10.77.0.2 -> 10.77.0.1 across the veth pair)
#   rsock    pingpong and iperf3 (-P 1, -P 4) with librsock.so preloaded on both ends;
#            every rsock process must show conns.rdma > 0 and conns.tcp == 0 in its
#            stats, otherwise the measurement counts as FAILED (a figure that was secretly
#            kernel TCP is worthless)
# plus, without --smoke: a syscall profile (strace -f) of ping-pong round trips for rsock,
# tcp and librspreload, an RSOCK_SPIN_US sweep, and a probe of iperf3 under librspreload.
#
# --smoke   one short iteration of each measurement (seconds per step), no speed checks
# --runs N  repetitions of each measurement (default 5; --smoke: 1)
# --out DIR where data.txt, env.txt, logs/ and prof/ go (default /tmp/rsock-bench)
#
# data.txt holds one record per line, "KIND key=value ...":
#   lat     path= size= run= median_us= p99_us= [mean_us= cpu_us_rt= csw_rt= src=]
#   bw      path= size= run= mbps= [cpu_s_gb= src=]
#   note    what= text=...        (e.g. how librspreload failed; never a failure)
#   fail    what= text=...        (a measurement that could not run or was not over RDMA)
#   prof    path= side= thread= syscall= per_rt=
# Exit status: 0 if every measurement ran (and rsock's went over RDMA), 1 otherwise.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/rdma-vm/lib.sh
rdma_vm_require_guest

SMOKE=0 RUNS= OUT=/tmp/rsock-bench
while (($#)); do
  case $1 in
    --smoke) SMOKE=1 ;;
    --runs) RUNS=${2:?}; shift ;;
    --out) OUT=${2:?}; shift ;;
    *) echo "usage: $0 [--smoke] [--runs N] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
RUNS=${RUNS:-$((SMOKE ? 1 : 5))}

ROOT=$PWD
# BENCH_BIN: a directory with librsock.so, rsock, pingpong and rdma_pingpong (run.sh
# passes a private copy, so that a rebuild in the shared tree cannot swap them mid-run);
# default: the build tree.
if [[ -n ${BENCH_BIN:-} ]]; then
  SO=$BENCH_BIN/librsock.so PP=$BENCH_BIN/pingpong RSOCK=$BENCH_BIN/rsock RDMAPP=$BENCH_BIN/rdma_pingpong
else
  SO=$ROOT/target/release/librsock.so PP=$ROOT/target/release/examples/pingpong
  RSOCK=$ROOT/target/release/rsock RDMAPP=$ROOT/target/release/examples/rdma_pingpong
fi
RSP=${RSPRELOAD:-/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so}
A=$RDMA_VM_ADDR
for f in "$SO" "$PP" "$RSOCK" "$RDMAPP"; do
  [[ -x $f || -f $f ]] || { echo "missing $f: cargo build --release --workspace --lib --bins --examples" >&2; exit 2; }
done
for c in ib_write_lat ib_write_bw ib_send_lat rstream iperf3 $( ((SMOKE)) || echo strace); do
  command -v "$c" >/dev/null || { echo "missing $c (tests/rdma-vm/setup.sh installs the bed's packages; bench/rdma/run.sh installs strace)" >&2; exit 2; }
done
[[ -f $RSP ]] || { echo "missing $RSP (package librdmacm1)" >&2; exit 2; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/logs
rm -rf "$LOGS" "$OUT/stats" "$OUT/prof"
mkdir -p "$LOGS" "$OUT/stats" "$OUT/prof"
DATA=$OUT/data.txt
: >"$DATA"
FAILS=0

# The shim's settings for every rsock process.
export RSOCK_CONNECT_TIMEOUT_MS=${RSOCK_CONNECT_TIMEOUT_MS:-5000}

# Sizes and counts. Latency sizes are the plot's x axis; iteration counts shrink with the
# size so that each step takes about the same time under TCG.
if ((SMOKE)); then
  LAT_SIZES=(64 4096) BW_SIZES=(65536) RS_LAT_SIZES=(64) RS_BW_SIZES=(65536) IPERF_SECS=1 PP_WARM=10
  lat_iters() { echo 50; }
  RDMAPP_BYTES=$((4 << 20))
  bw_count() { echo 50; }
else
  LAT_SIZES=(64 1024 4096 16384 65536) BW_SIZES=(64 4096 65536) RS_LAT_SIZES=(64 4096) RS_BW_SIZES=(65536)
  IPERF_SECS=${BENCH_IPERF_SECS:-4} PP_WARM=50 RDMAPP_BYTES=$((16 << 20))
  lat_iters() { case $1 in 64 | 1024) echo 1000 ;; 4096) echo 500 ;; 16384) echo 300 ;; *) echo 200 ;; esac; }
  bw_count() { case $1 in 64) echo 10000 ;; 4096) echo 3000 ;; *) echo 400 ;; esac; }
fi
join() { local IFS=,; echo "$*"; }
PP_SIZES=$(join "${LAT_SIZES[@]}")
PP_ITERS=$(for s in "${LAT_SIZES[@]}"; do lat_iters "$s"; done | paste -sd,)

PORT=20000
next_port() { PORT=$((PORT + 1)); }

say() { printf '[%6.1fs] %s\n' "$SECONDS" "$*"; }
rec() { echo "$*" >>"$DATA"; }
fail() { FAILS=$((FAILS + 1)); rec "fail what=$1 text=${2//$'\n'/ }"; say "FAIL $1: $2"; }
note() { rec "note what=$1 text=${2//$'\n'/ }"; say "note $1: $2"; }

# Background processes: each in its own session (process group), killed at exit.
BG=()
start_bg() {
  local log=$1
  shift
  setsid "$@" </dev/null >"$log" 2>&1 &
  BG_PID=$!
  BG+=("$BG_PID")
}
stop_bg() {
  kill -TERM -- "-$1" 2>/dev/null
  local i
  for i in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() {
  local p
  for p in "${BG[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
}
trap cleanup EXIT

# Environment of an rsock process whose stats go to directory $1.
rsock_env() { echo env LD_PRELOAD="$SO" RSOCK_STATS_DIR="$1" RSOCK_STATS_KEEP=1; }
rsp_env() { echo env LD_PRELOAD="$RSP"; }

# check_rdma WHAT DIR: every process that left stats in DIR had conns.rdma > 0 and
# conns.tcp == 0; otherwise a failure is recorded.
check_rdma() {
  local what=$1 dir=$2 json n=0 bad=0 line r t
  json=$("$RSOCK" stat --dir "$dir" --all --json 2>&1)
  while IFS= read -r line; do
    [[ $line == *'"conns"'* ]] || continue
    n=$((n + 1))
    r=$(sed -n 's/.*"conns":{"rdma":\([0-9]*\),"tcp":\([0-9]*\).*/\1/p' <<<"$line")
    t=$(sed -n 's/.*"conns":{"rdma":\([0-9]*\),"tcp":\([0-9]*\).*/\2/p' <<<"$line")
    if [[ -z $r || $r -eq 0 || $t -ne 0 ]]; then bad=$((bad + 1)); fi
  done <<<"$json"
  echo "$json" >"$dir.json"
  if ((n == 0 || bad > 0)); then
    fail "$what" "not over RDMA: $n processes with stats, $bad with conns.rdma==0 or conns.tcp>0: $(head -c 600 <<<"$json")"
    return 1
  fi
  say "  $what: $n processes, all over RDMA"
}

# ---- the limit: perftest -------------------------------------------------------------

# perftest sometimes fails to connect on this bed ("Failed to connect RDMA CM events", then
# SIGSEGV): one retry on a fresh port.
perftest_pair() {
  perftest_once "$@" || { echo "perftest failed once, retrying" >>"$1-cli.log"; cp "$1-cli.log" "$1-cli.try1.log"; perftest_once "$@"; }
}
perftest_once() { # LOGBASE PROG ARGS...: server then client; client output in LOGBASE-cli.log
  local base=$1 prog=$2 rc=0
  shift 2
  next_port
  start_bg "$base-srv.log" timeout 120 "$prog" -R -d rxe0 -F -p "$PORT" "$@"
  local srv=$BG_PID
  if ! wait_rdma_listen "$PORT" 30; then stop_bg "$srv"; return 1; fi
  timeout 120 "$prog" -R -d rxe0 -F -p "$PORT" "$@" "$A" >"$base-cli.log" 2>&1 || rc=$?
  wait "$srv" 2>/dev/null || rc=$((rc ? rc : 1))
  stop_bg "$srv"
  return "$rc"
}

verbs_lat() { # SIZE RUN
  local s=$1 r=$2 n base line
  n=$(lat_iters "$s")
  base=$LOGS/verbs-lat-$s-$r
  if ! perftest_pair "$base" ib_write_lat -s "$s" -n "$n"; then
    fail "verbs-lat-$s" "ib_write_lat failed: $(tail -n 3 "$base-cli.log" "$base-srv.log" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%  (one-way = RTT/2)
  line=$(awk -v s="$s" '$1 == s && NF >= 9 { print; exit }' "$base-cli.log")
  [[ -n $line ]] || { fail "verbs-lat-$s" "no result line in $(basename "$base")-cli.log"; return; }
  read -r _ _ _ _ typ avg _ p99 _ <<<"$line"
  if ! awk -v x="$typ" 'BEGIN { exit !(x + 0 > 0 && x != "inf") }'; then
    note "verbs-lat-$s" "run $r: ib_write_lat printed '$typ' (its cycle-counter calibration failed under TCG); run dropped"
    return
  fi
  rec "lat path=verbs size=$s run=$r median_us=$(awk -v x="$typ" 'BEGIN{printf "%.2f", 2*x}') p99_us=$(awk -v x="$p99" 'BEGIN{printf "%.2f", 2*x}') mean_us=$(awk -v x="$avg" 'BEGIN{printf "%.2f", 2*x}') src=ib_write_lat"
}

# ib_send_lat -e: the client sleeps on completion events instead of busy-polling, i.e. what
# a latency path that blocks (as a blocking socket does after its spin) pays on this bed.
verbs_events_lat() { # SIZE RUN
  local s=$1 r=$2 n base line
  n=$(lat_iters "$s")
  base=$LOGS/verbs-ev-lat-$s-$r
  if ! perftest_pair "$base" ib_send_lat -s "$s" -n "$n" -e; then
    # perftest's own crash in events mode ("Failed to connect RDMA CM events", then
    # SIGSEGV) is not something rsock can fix: noted; rdma_pingpong --events is the
    # reference that counts.
    note "verbs-events-lat-$s" "run $r: ib_send_lat -e failed: $(tail -qn 2 "$base-cli.log" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  line=$(awk -v s="$s" '$1 == s && NF >= 9 { print; exit }' "$base-cli.log")
  [[ -n $line ]] || { fail "verbs-events-lat-$s" "no result line"; return; }
  read -r _ _ _ _ typ avg _ p99 _ <<<"$line"
  if ! awk -v x="$typ" 'BEGIN { exit !(x + 0 > 0 && x != "inf") }'; then
    note "verbs-events-lat-$s" "run $r: ib_send_lat printed '$typ' (cycle-counter calibration failed); run dropped"
    return
  fi
  rec "lat path=verbs-events size=$s run=$r median_us=$(awk -v x="$typ" 'BEGIN{printf "%.2f", 2*x}') p99_us=$(awk -v x="$p99" 'BEGIN{printf "%.2f", 2*x}') mean_us=$(awk -v x="$avg" 'BEGIN{printf "%.2f", 2*x}') src=ib_send_lat-e"
}

verbs_bw() { # SIZE RUN
  local s=$1 r=$2 n base line
  n=$(bw_count "$s")
  base=$LOGS/verbs-bw-$s-$r
  if ! perftest_pair "$base" ib_write_bw -s "$s" -n "$n" --report_gbits; then
    fail "verbs-bw-$s" "ib_write_bw failed: $(tail -n 3 "$base-cli.log" "$base-srv.log" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  # #bytes #iterations BW_peak BW_average MsgRate   (Gb/s, 10^9 bit)
  line=$(awk -v s="$s" '$1 == s && NF >= 5 { print; exit }' "$base-cli.log")
  [[ -n $line ]] || { fail "verbs-bw-$s" "no result line in $(basename "$base")-cli.log"; return; }
  read -r _ _ _ avg _ <<<"$line"
  if ! awk -v x="$avg" 'BEGIN { exit !(x + 0 > 0 && x != "inf") }'; then
    note "verbs-bw-$s" "run $r: ib_write_bw printed '$avg'; run dropped"
    return
  fi
  rec "bw path=verbs size=$s run=$r mbps=$(awk -v x="$avg" 'BEGIN{printf "%.2f", 1000*x}') src=ib_write_bw"
}

# rsock's own verbs layer without the shim or the stream protocol (examples/rdma_pingpong):
# WRITE_WITH_IMM ping-pong at 64 B and 4 KiB timed with Instant (busy-polling the CQ, or
# sleeping on completion events with --events), then a credit-limited 64 KiB stream.
rdmapp_run() { # poll|events RUN
  local mode=$1 r=$2 base=$LOGS/rdmapp-$1-$2 ev=() n label
  [[ $mode == events ]] && ev=(--events)
  label=rdmapp$([[ $mode == events ]] && echo -events)
  n=$(lat_iters 64)
  next_port
  start_bg "$base-srv.log" timeout 180 "$RDMAPP" server "$A" "$PORT" --timeout 170
  local srv=$BG_PID
  if ! wait_rdma_listen "$PORT" 30 ||
    ! timeout 180 "$RDMAPP" client "$A" "$PORT" --iters "$n" --bytes "$RDMAPP_BYTES" --size 65536 --timeout 170 "${ev[@]}" >"$base-cli.log" 2>&1; then
    fail "$label" "rdma_pingpong failed: $(tail -n 3 "$base-cli.log" "$base-srv.log" 2>/dev/null | tr '\n' ' ')"
    stop_bg "$srv"; return
  fi
  wait "$srv" 2>/dev/null
  stop_bg "$srv"
  # RESULT lat size=64 iters=N rtt_us min=.. median=.. avg=.. ... / RESULT bw size=.. ... Gbps=..
  awk -v path="$label" -v r="$r" '
    $1 == "RESULT" && $2 == "lat" {
      for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "rtt_us") rt = 1; if (kv[1] == "one_way_us") rt = 0
        if (kv[1] == "size") sz = kv[2]; if (rt && kv[1] == "median") md = kv[2]; if (rt && kv[1] == "avg") av = kv[2] }
      printf "lat path=%s size=%s run=%s median_us=%s mean_us=%s src=rdma_pingpong\n", path, sz, r, md, av }
    $1 == "RESULT" && $2 == "bw" {
      for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "size") sz = kv[2]; if (kv[1] == "Gbps") g = kv[2] }
      printf "bw path=%s size=%s run=%s mbps=%.2f src=rdma_pingpong\n", path, sz, r, g * 1000 }' "$base-cli.log" >>"$DATA"
  grep -q "^lat path=$label size=64 run=$r " "$DATA" || fail "$label" "no RESULT lines in $(basename "$base")-cli.log"
}

# ---- the peer: rsocket ---------------------------------------------------------------

rstream_pair() { # LOGBASE ARGS...
  local base=$1 rc=0
  shift
  next_port
  start_bg "$base-srv.log" timeout 120 rstream -b "$A" -p "$PORT" "$@"
  local srv=$BG_PID
  if ! wait_rdma_listen "$PORT" 30; then stop_bg "$srv"; return 1; fi
  timeout 120 rstream -s "$A" -p "$PORT" "$@" >"$base-cli.log" 2>&1 || rc=$?
  wait "$srv" 2>/dev/null
  stop_bg "$srv"
  return "$rc"
}

# rstream prints: name bytes xfers iters total time Gb/sec usec/xfer; usec/xfer is half
# a round trip in its latency test (-C 1). rstream busy-polls (nonblocking calls).
rsocket_lat() {
  local s=$1 r=$2 n base line
  n=$(lat_iters "$s")
  base=$LOGS/rstream-lat-$s-$r
  if ! rstream_pair "$base" -S "$s" -C 1 -I "$n"; then
    fail "rstream-lat-$s" "rstream failed: $(tail -n 3 "$base-cli.log" "$base-srv.log" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  line=$(awk '$1 == "custom" { l = $0 } END { print l }' "$base-cli.log")
  [[ -n $line ]] || { fail "rstream-lat-$s" "no result line"; return; }
  rec "lat path=rstream size=$s run=$r mean_us=$(awk '{printf "%.2f", 2*$NF}' <<<"$line") src=rstream"
}

rsocket_bw() {
  local s=$1 r=$2 n base line
  n=$(bw_count "$s")
  base=$LOGS/rstream-bw-$s-$r
  if ! rstream_pair "$base" -S "$s" -C "$n" -I 1; then
    fail "rstream-bw-$s" "rstream failed: $(tail -n 3 "$base-cli.log" "$base-srv.log" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  line=$(awk '$1 == "custom" { l = $0 } END { print l }' "$base-cli.log")
  [[ -n $line ]] || { fail "rstream-bw-$s" "no result line"; return; }
  rec "bw path=rsocket size=$s run=$r mbps=$(awk '{printf "%.2f", 1000*$(NF-1)}' <<<"$line") src=rstream"
}

# ---- pingpong: rsock, tcp, librspreload ----------------------------------------------

# pp_server PATH PORT: starts the pingpong server for PATH; sets PP_SRV.
# A path named X-epoll is path X with pingpong's --epoll (waits in epoll_wait).
pp_server() {
  local path=$1 port=$2 envc=() mode=()
  [[ $path == *-epoll ]] && mode=(--epoll)
  case ${path%-epoll} in
    rsock) read -ra envc <<<"$(rsock_env "$OUT/stats/pp-$path-srv")"; mkdir -p "$OUT/stats/pp-$path-srv" ;;
    rspreload) read -ra envc <<<"$(rsp_env)" ;;
  esac
  start_bg "$LOGS/pp-$path-srv-$port.log" "${envc[@]}" "$PP" server "$A:$port" "${mode[@]}"
  PP_SRV=$BG_PID
  case ${path%-epoll} in
    rsock | rspreload) wait_rdma_listen "$port" 60 ;;
    tcp) wait_tcp_listen "$port" 60 ;;
  esac
}

# pp_client PATH PORT RUN LOG [pingpong args...]: one client run, output in LOG.
pp_client() {
  local path=$1 port=$2 run=$3 log=$4 envc=() pre=() mode=()
  shift 4
  [[ $path == *-epoll ]] && mode=(--epoll)
  case ${path%-epoll} in
    rsock) mkdir -p "$OUT/stats/pp-$path-cli-$run"; read -ra envc <<<"$(rsock_env "$OUT/stats/pp-$path-cli-$run")" ;;
    rspreload) read -ra envc <<<"$(rsp_env)" ;;
    tcp) pre=(in_plain) ;;
  esac
  "${pre[@]}" timeout 300 "${envc[@]}" ${PP_WRAP:-} "$PP" client "$A:$port" --label "$path" "${mode[@]}" "$@" >"$log" 2>&1
}

# Servers stay up for all runs (one per path); each run is a fresh client connection.
declare -A PP_PORT PP_PID
pp_start() { # PATH
  local path=$1
  next_port; PP_PORT[$path]=$PORT
  if ! pp_server "$path" "$PORT"; then
    if [[ $path == rspreload ]]; then note "pingpong-rspreload" "server did not listen: $(tail -n 3 "$LOGS/pp-$path-srv-$PORT.log" | tr '\n' ' ')"
    else fail "pingpong-$path" "server did not listen: $(tail -n 3 "$LOGS/pp-$path-srv-$PORT.log" | tr '\n' ' ')"; fi
    stop_bg "$PP_SRV"; PP_PORT[$path]=; return
  fi
  PP_PID[$path]=$PP_SRV
}
pp_run() { # PATH RUN
  local path=$1 r=$2 log=$LOGS/pp-$1-$2.log
  [[ -n ${PP_PORT[$path]:-} ]] || return
  if ! pp_client "$path" "${PP_PORT[$path]}" "$r" "$log" --size "$PP_SIZES" --iters "$PP_ITERS" --warmup "$PP_WARM"; then
    if [[ $path == rspreload ]]; then
      note "pingpong-rspreload" "run $r failed: $(tail -n 3 "$log" | tr '\n' ' ')"
    else
      fail "pingpong-$path" "run $r failed: $(tail -n 3 "$log" | tr '\n' ' ')"
    fi
    return
  fi
  grep '^pingpong ' "$log" | while read -r _ label size iters med p99 mean _ _ ccpu scpu ccsw scsw; do
    rec "lat path=$path ${size} run=$r ${med} ${p99} ${mean} cpu_us_rt=$(awk -v a="${ccpu#*=}" -v b="${scpu#*=}" 'BEGIN{printf "%.2f", a+b}') csw_rt=$(awk -v a="${ccsw#*=}" -v b="${scsw#*=}" 'BEGIN{printf "%.3f", a+b}') src=pingpong"
  done
}
pp_stop_all() {
  local path d
  for path in "${!PP_PID[@]}"; do stop_bg "${PP_PID[$path]}"; done
  for d in "$OUT"/stats/pp-rsock-*; do [[ -d $d ]] && check_rdma "pingpong-rsock-$(basename "$d")" "$d"; done
}

# ---- iperf3: rsock, tcp --------------------------------------------------------------

declare -A IP_PORT IP_PID IP_ENV IP_PRE
iperf_start() { # PATH
  local path=$1 envc=() sd
  next_port; IP_PORT[$path]=$PORT
  IP_ENV[$path]= IP_PRE[$path]=
  case $path in
    rsock) sd=$OUT/stats/iperf-rsock; mkdir -p "$sd"; IP_ENV[$path]=$(rsock_env "$sd") ;;
    tcp) IP_PRE[$path]=in_plain ;;
  esac
  read -ra envc <<<"${IP_ENV[$path]}"
  start_bg "$LOGS/iperf-$path-srv.log" "${envc[@]}" iperf3 -s -B "$A" -p "$PORT"
  IP_PID[$path]=$BG_PID
  case $path in
    rsock) wait_rdma_listen "$PORT" 60 ;;
    *) wait_tcp_listen "$PORT" 60 ;;
  esac || { fail "iperf3-$path" "server did not listen"; stop_bg "$BG_PID"; IP_PORT[$path]=; }
}
iperf_run() { # PATH STREAMS RUN
  local path=$1 P=$2 r=$3 log envc=() pre=() v
  [[ -n ${IP_PORT[$path]:-} ]] || return
  read -ra envc <<<"${IP_ENV[$path]}"
  read -ra pre <<<"${IP_PRE[$path]}"
  log=$LOGS/iperf-$path-P$P-$r.json
  if ! "${pre[@]}" timeout $((IPERF_SECS + 60)) "${envc[@]}" iperf3 -c "$A" -p "${IP_PORT[$path]}" -t "$IPERF_SECS" -P "$P" -J >"$log" 2>"$log.err"; then
    fail "iperf3-$path-P$P" "run $r failed: $(grep -m1 '"error"' "$log") $(tail -n 2 "$log.err" | tr '\n' ' ')"
    return
  fi
  # Mbit/s received; CPU s/GB = (client + server CPU %) / 100 * seconds / GB
  v=$(awk '
    /"sum_received"/ { inr = 1 }
    inr && /"seconds"/ && !sec { gsub(/[,]/, ""); sec = $2 }
    inr && /"bytes"/ && !byt { gsub(/[,]/, ""); byt = $2 }
    inr && /"bits_per_second"/ && !bps { gsub(/[,]/, ""); bps = $2 }
    /"host_total"/ { gsub(/[,]/, ""); h = $2 }
    /"remote_total"/ { gsub(/[,]/, ""); rm = $2 }
    END { if (bps > 0 && byt > 0) printf "mbps=%.2f cpu_s_gb=%.3f", bps / 1e6, (h + rm) / 100 * sec / (byt / 1e9) }' "$log")
  [[ -n $v ]] || { fail "iperf3-$path-P$P" "run $r: no result in $log"; return; }
  rec "bw path=$path size=iperf3-P$P run=$r $v src=iperf3"
}
iperf_stop_all() {
  local path
  for path in "${!IP_PID[@]}"; do stop_bg "${IP_PID[$path]}"; done
  [[ -d $OUT/stats/iperf-rsock ]] && check_rdma "iperf3-rsock" "$OUT/stats/iperf-rsock"
}

# ---- profile: syscalls per round trip ------------------------------------------------

# strace_count FILE PATH SIDE ITERS: syscalls of every thread between the process's two
# getrusage calls (pingpong calls it just before and just after its timed round trips).
strace_count() {
  local f=$1 path=$2 side=$3 n=$4
  awk -v n="$n" -v path="$path" -v side="$side" '
    { pid = $1; name = $2; sub(/\(.*/, "", name) }
    name == "getrusage" { g++; if (g == 1) { on = 1; main = pid; next } if (g == 2) { on = 0 } }
    on && name ~ /^[a-z_0-9]+$/ {
      th = (pid == main) ? "main" : "other"
      c[th " " name]++; tot[th]++
    }
    END {
      for (k in c) { split(k, a, " "); printf "prof path=%s side=%s thread=%s syscall=%s per_rt=%.3f\n", path, side, a[1], a[2], c[k] / n }
      for (t in tot) printf "prof path=%s side=%s thread=%s syscall=ALL per_rt=%.3f\n", path, side, t, tot[t] / n
    }' "$f" >>"$DATA"
}

profile_path() { # PATH
  local path=$1 n=${BENCH_PROF_ITERS:-300} port envs=() envc=() pre=() sd
  next_port; port=$PORT
  case $path in
    rsock)
      sd=$OUT/stats/prof-rsock; mkdir -p "$sd"
      read -ra envs <<<"$(rsock_env "$sd")"; envc=("${envs[@]}") ;;
    rspreload) read -ra envs <<<"$(rsp_env)"; envc=("${envs[@]}") ;;
    tcp) pre=(in_plain) ;;
  esac
  # strace -f follows the shim's helper thread; the preload goes through -E so that strace
  # itself is not preloaded.
  local se=() ce=() e
  for e in "${envs[@]:1}"; do se+=(-E "$e"); done
  ce=("${se[@]}")
  start_bg "$LOGS/prof-$path-srv.log" strace -f -qq -o "$OUT/prof/strace-$path-srv.txt" "${se[@]}" "$PP" server "$A:$port" --once
  local srv=$BG_PID
  case $path in
    tcp) wait_tcp_listen "$port" 60 ;;
    *) wait_rdma_listen "$port" 60 ;;
  esac || { fail "profile-$path" "server did not listen"; stop_bg "$srv"; return; }
  if ! "${pre[@]}" timeout 300 strace -f -qq -o "$OUT/prof/strace-$path-cli.txt" "${ce[@]}" \
      "$PP" client "$A:$port" --label "$path-strace" --size 64 --iters "$n" --warmup 50 >"$LOGS/prof-$path-cli.log" 2>&1; then
    if [[ $path == rspreload ]]; then note "profile-rspreload" "$(tail -n 2 "$LOGS/prof-$path-cli.log")"; else fail "profile-$path" "$(tail -n 2 "$LOGS/prof-$path-cli.log")"; fi
  fi
  wait "$srv" 2>/dev/null
  stop_bg "$srv"
  [[ $path == rsock ]] && check_rdma "profile-rsock" "$sd"
  strace_count "$OUT/prof/strace-$path-cli.txt" "$path" client "$n"
  strace_count "$OUT/prof/strace-$path-srv.txt" "$path" server "$n"
  grep '^pingpong ' "$LOGS/prof-$path-cli.log" | sed "s/^pingpong /profrun /" >>"$DATA"
  say "  profile $path: $(grep "^prof path=$path side=client thread=main syscall=ALL" "$DATA" | sed 's/.*per_rt=//') syscalls/RT in the client's main thread"
}

# RSOCK_SPIN_US sweep: one run of 64 B and 4 KiB ping-pong per value (1000 = the default, as
# the control: the sweep runs after the profile, when the host's load may differ).
spin_sweep() {
  local spin port log
  for spin in 0 20 200 1000 5000; do
    next_port; port=$PORT
    RSOCK_SPIN_US=$spin pp_server rsock "$port" || { fail "spin-$spin" "server did not listen"; stop_bg "$PP_SRV"; continue; }
    log=$LOGS/pp-spin-$spin.log
    if RSOCK_SPIN_US=$spin pp_client rsock "$port" "spin$spin" "$log" --size 64,4096 --iters 1000,500 --warmup 50; then
      grep '^pingpong ' "$log" | sed "s/^pingpong /spin spin_us=$spin /" >>"$DATA"
    else
      fail "spin-$spin" "$(tail -n 2 "$log")"
    fi
    stop_bg "$PP_SRV"
  done
  local d
  for d in "$OUT"/stats/pp-rsock-cli-spin*; do check_rdma "spin-$(basename "$d")" "$d"; done
}

# librspreload with iperf3: expected to fail (recorded as a note, never a failure).
rspreload_iperf_probe() {
  local port log rc=0
  next_port; port=$PORT
  start_bg "$LOGS/rsp-iperf-srv.log" env LD_PRELOAD="$RSP" timeout 60 iperf3 -s -1 -B "$A" -p "$port"
  local srv=$BG_PID
  wait_rdma_listen "$port" 30 || { note "rspreload-iperf3" "server: no rdma_cm listener: $(tail -n 2 "$LOGS/rsp-iperf-srv.log" | tr '\n' ' ')"; stop_bg "$srv"; return; }
  log=$LOGS/rsp-iperf-cli.log
  timeout 40 env LD_PRELOAD="$RSP" iperf3 -c "$A" -p "$port" -t 3 >"$log" 2>&1 || rc=$?
  local src=running summary
  if ! kill -0 "$srv" 2>/dev/null; then wait "$srv" 2>/dev/null; src=$?; fi
  stop_bg "$srv"
  summary=$(grep -h -E 'error|receiver|sender|not supported' "$log" "$LOGS/rsp-iperf-srv.log" | sort | uniq -c | head -n 4 | sed 's/  */ /g' | tr '\n' ';')
  note "rspreload-iperf3" "client exit $rc$( ((rc == 124)) && echo ' (killed after 40 s)'), server exit $src$([[ $src == 139 ]] && echo ' (SIGSEGV)'); output: $summary"
}

# ---- run -----------------------------------------------------------------------------

{
  echo "guest_kernel=$(uname -r)"
  echo "guest_cpus=$(nproc)"
  echo "guest_mem_mb=$(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo)"
  echo "rxe_active_mtu=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')"
  echo "veth0_mtu=$(cat /sys/class/net/veth0/mtu)"
  echo "clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
  echo "smoke=$SMOKE"
  echo "runs=$RUNS"
  echo "rsock_spin_us=${RSOCK_SPIN_US:-default(400)}"
  echo "librsock_sha256=$(sha256sum "$SO" | cut -c1-16)"
} >"$OUT/env.txt"

say "rdma bench: $([[ $SMOKE == 1 ]] && echo smoke || echo full), $RUNS run(s), sizes ${LAT_SIZES[*]}"

# Every run measures every path, one after the other, so that the host's load (which
# drifts) hits all of them alike.
PP_PATHS=(rsock tcp rspreload rsock-epoll tcp-epoll)
for p in "${PP_PATHS[@]}"; do pp_start "$p"; done
for p in rsock tcp; do iperf_start "$p"; done
for r in $(seq "$RUNS"); do
  say "run $r/$RUNS: verbs"
  for s in "${LAT_SIZES[@]}"; do verbs_lat "$s" "$r"; done
  ((SMOKE)) || verbs_events_lat 64 "$r"
  for s in "${BW_SIZES[@]}"; do verbs_bw "$s" "$r"; done
  rdmapp_run poll "$r"
  ((SMOKE)) || rdmapp_run events "$r"
  say "run $r/$RUNS: rsocket (rstream)"
  for s in "${RS_LAT_SIZES[@]}"; do rsocket_lat "$s" "$r"; done
  for s in "${RS_BW_SIZES[@]}"; do rsocket_bw "$s" "$r"; done
  say "run $r/$RUNS: pingpong"
  for p in "${PP_PATHS[@]}"; do pp_run "$p" "$r"; done
  say "run $r/$RUNS: iperf3"
  for P in 1 4; do
    for p in rsock tcp; do iperf_run "$p" "$P" "$r"; done
  done
done
pp_stop_all
iperf_stop_all

if ((!SMOKE)); then
  say "profile (strace -f, 64 B ping-pong)"
  for p in rsock tcp rspreload; do profile_path "$p"; done
  say "RSOCK_SPIN_US sweep"
  spin_sweep
  say "librspreload + iperf3 probe"
  rspreload_iperf_probe
fi

left=$(rdma resource show qp 2>/dev/null | grep -v "type GSI" | grep -c type)
((left == 0)) || note "leftover-qps" "$left RC QPs left after the benchmark"
say "done: $(grep -c '^lat ' "$DATA") latency and $(grep -c '^bw ' "$DATA") bandwidth records, $FAILS failure(s)"
if ((FAILS)); then
  grep '^fail ' "$DATA"
  echo "rdma bench: $FAILS measurement(s) FAILED"
  exit 1
fi
echo "rdma bench: all measurements ran; rsock's went over RDMA"
