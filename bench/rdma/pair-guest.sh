#!/usr/bin/env bash
# Runs on both guests of the two-host bed for bench/rdma/pair.sh: node 1 serves, node 0
# measures. Each round runs every cell once, in the same order, so the ratios within a
# round compare like with like. Node 0 writes DIR/data.txt: one line per measurement,
#   lat cell=C size=S round=R median_us=.. p99_us=..   (round-trip times)
#   pkts cell=C round=R rts=N sent=N rcvd=N            (node 0's rxe0 packets for N round trips)
#
#   rps cell=C what=W value=N [lat_p99_ms=..]          (real servers, after the rounds)
#   cpu cell=C what=W units=N n0u=.. n0k=.. n1u=.. n1k=.. secs=..
#       CPU clock ticks (USER_HZ) each whole node spent over a measurement of N round trips
#       or requests lasting secs: user, and kernel (system + irq + softirq, where rxe does
#       its work); cell=idle: ten seconds with nothing measured
#
#   bench/rdma/pair-guest.sh --out DIR [--rounds N] [--iters N] [--no-servers]
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../../tests/rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "pair-guest.sh: needs --topology pair" >&2; exit 2; }

OUT= ROUNDS=3 ITERS=1000 SERVERS=1 WRK_D=10 PG_T=15
SERVER_KINDS=${SERVER_KINDS:-nginx pg redis memcached}
while (($#)); do
  case $1 in
    --out) OUT=${2:?}; shift ;;
    --rounds) ROUNDS=${2:?}; shift ;;
    --iters) ITERS=${2:?}; shift ;;
    --no-servers) SERVERS=0 ;;
    *) echo "usage: $0 --out DIR [--rounds N] [--iters N] [--no-servers]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OUT" ] || { echo "--out is required" >&2; exit 2; }
BIN=${BENCH_BIN:?BENCH_BIN (the copied binaries) must be set}
WORK=$(mktemp -d /tmp/rsock-pair-bench.XXXXXX)
WARM=50
# Cells: NAME PORT KIND, KIND = rsock|tcp (examples/pingpong, blocking or --epoll;
# rsock-nospin: RSOCK_SPIN_US=0 at both ends, as the two guests share two host cores and a
# waiter that polls takes them from the other guest) or
# perftest (ib_write_lat: RDMA WRITE polled in memory, busy; ib_send_lat -e: SEND, the
# waiter sleeps on the completion channel as a blocked rsock call does).
CELLS="rsock:7601:rsock tcp:7602:tcp rsock-epoll:7603:rsock tcp-epoll:7604:tcp rsock-nospin:7605:rsock write_lat:0:perftest send_lat_e:0:perftest"

shim() { # DIR CMD...
  local dir=$1 spin=(); shift
  case $dir in *nospin*) spin=(RSOCK_SPIN_US=0) ;; esac
  env "${spin[@]}" LD_PRELOAD="$BIN/librsock.so" RSOCK_STATS_DIR="$dir" RSOCK_STATS_KEEP=1 RSOCK_LOG="$dir.log" \
    RSOCK_CONNECT_TIMEOUT_MS=20000 "$@"
}
# ---- CPU per round trip / request, both nodes --------------------------------------------
# A whole node's CPU ticks (user, kernel) from /proc/stat: the device is software here, so
# its work is kernel time of the node, and a fair per-message cost includes it.
PAIR=/run/rdma-vm/pair
cpu_now() { awk '$1 == "cpu" { print $2 + $3, $4 + $7 + $8; exit }' /proc/stat; cut -d' ' -f1 /proc/uptime; }
# Node 1 answers node 0's "cpusnap-NAME" with its own counters in "cpu1-NAME". It looks
# every 0.1 s without forking (`nap`): what it costs is node 1's CPU time too, in every
# cell alike.
cpu_answer() {
  local f n
  while :; do
    for f in "$PAIR"/cpusnap-*; do
      [ -e "$f" ] || continue
      n=${f##*/cpusnap-}
      [ -e "$PAIR/cpu1-$n" ] || { cpu_now >"$PAIR/cpu1-$n.tmp" && mv "$PAIR/cpu1-$n.tmp" "$PAIR/cpu1-$n"; }
    done
    nap
  done
}
cpu_mark() { # NAME: prints both nodes' counters now (node 0's user, kernel, uptime; node 1's)
  local mine
  pair_signal "cpusnap-$1"
  mine=$(cpu_now)
  wait_until 30 test -e "$PAIR/cpu1-$1" || { echo $mine 0 0 0; return 1; }
  echo $mine $(cat "$PAIR/cpu1-$1")
}
cpu_line() { # CELL WHAT UNITS BEFORE AFTER: a "cpu" line of the deltas (secs: node 0's clock)
  local -a a=($4) b=($5)
  echo "cpu cell=$1 what=$2 units=$3 n0u=$((b[0] - a[0])) n0k=$((b[1] - a[1])) n1u=$((b[3] - a[3])) n1k=$((b[4] - a[4])) secs=$(awk -v x="${a[2]}" -v y="${b[2]}" 'BEGIN { printf "%.2f", y - x }')" >>"$data"
}
cpu_seq=0
cpu_begin() { cpu_seq=$((cpu_seq + 1)); cpu_before=$(cpu_mark "$cpu_seq-a"); }
cpu_end() { cpu_line "$1" "$2" "$3" "$cpu_before" "$(cpu_mark "$cpu_seq-b")"; }

epoll_flag() { case $1 in *-epoll) echo --epoll ;; esac; }
perftest_cmd() { case $1 in write_lat) echo "ib_write_lat" ;; send_lat_e) echo "ib_send_lat -e" ;; esac; }

# ---- real servers across the wire (after the latency rounds) --------------------------------
# nginx as bench/rdma/fork.sh runs it (master + 2 workers, workers as nobody) and PostgreSQL
# (pgbench -c 4 -j 2), Redis (redis-benchmark -c 8, SET and GET) and memcached (memcslap
# --concurrency 8, set and get, as user memcache); the rsock cell has both ends preloaded,
# the TCP cell neither.
# shellcheck source=../../tests/rdma/fork/servers.sh
. tests/rdma/fork/servers.sh
W=/tmp/rsock-pair-servers
serve_one() { # KIND PATH: runs a server until node 0 says it is done
  local kind=$1 path=$2 d=$W/$1-$2 port pre=()
  [ "$path" = rsock ] && pre=(env LD_PRELOAD="$BIN/librsock.so" RSOCK_STATS_DIR="$WORK/srv-$kind" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=20000)
  case $kind in
    nginx)
      port=7611
      nginx_conf "$d" "$RDMA_VM_SELF" $port off
      head -c 4096 /dev/urandom >"$d/www/4k.bin"
      head -c 65536 /dev/urandom >"$d/www/64k.bin"
      "${pre[@]}" nginx -p "$d" -c "$d/nginx.conf" -e "$d/nginx-error.log" >"$d.out" 2>&1 &
      ;;
    pg)
      port=7621
      pg_init "$d" || { echo "pair-guest: initdb failed" >&2; return 1; }
      echo "host all all 10.77.1.0/24 trust" >>"$d/data/pg_hba.conf"
      # shellcheck disable=SC2046 # pg_server_args prints words
      "${pre[@]}" setpriv --reuid=postgres --regid=postgres --init-groups \
        "$(pg_bin)/postgres" $(pg_server_args "$d" "$RDMA_VM_SELF" $port) >"$d.out" 2>&1 &
      ;;
    redis)
      port=7631
      mkdir -p "$d"
      "${pre[@]}" redis-server --port $port --bind "$RDMA_VM_SELF" --protected-mode no --save '' \
        --appendonly no --dir "$d" >"$d.out" 2>&1 &
      ;;
    memcached)
      port=7641
      mkdir -p "$d"
      "${pre[@]}" memcached -u memcache -l "$RDMA_VM_SELF" -p $port -U 0 >"$d.out" 2>&1 &
      ;;
  esac
  local srv=$!
  wait_tcp_listen $port 120 || echo "pair-guest: $kind ($path) did not listen: $(tail -c 300 "$d.out")" >&2
  pair_signal "srv-$kind-$path"
  pair_wait "cli-$kind-$path" 600
  kill -TERM $srv 2>/dev/null; wait $srv 2>/dev/null
  [ "$kind" = nginx ] && pkill -f "nginx -p $d" 2>/dev/null
  sleep 1
}
serve_servers() {
  for kind in $SERVER_KINDS; do for path in rsock tcp; do serve_one $kind $path; done; done
}
client_servers() {
  local kind path pre out
  for kind in $SERVER_KINDS; do
    for path in rsock tcp; do
      pair_wait "srv-$kind-$path" 600 || return 1
      pre=()
      [ "$path" = rsock ] && pre=(env LD_PRELOAD="$BIN/librsock.so" RSOCK_STATS_DIR="$WORK/cli-$kind" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=20000)
      case $kind in
        nginx)
          for f in 4k 64k; do
            cpu_begin
            out=$("${pre[@]}" timeout 120 wrk -t 2 -c 8 -d "${WRK_D}s" --latency --timeout 10s "http://$RDMA_VM_PEER:7611/$f.bin" 2>&1)
            awk -v c="$path" -v w="wrk-$f" '/^Requests\/sec:/ { r = $2 } $1 == "99%" { p = $2 }
              /Non-2xx|Socket errors/ { e = e $0 }
              END { gsub(/ /, "_", e); printf "rps cell=%s what=%s value=%s p99=%s errors=%s\n", c, w, r, p, e }' <<<"$out" >>"$data"
            cpu_end "$path" "wrk-$f" "$(awk '/ requests in / { print $1 }' <<<"$out")"
          done
          ;;
        pg)
          local pg=(-h "$RDMA_VM_PEER" -p 7621 -U postgres)
          "${pre[@]}" timeout 300 pgbench -i -s 1 "${pg[@]}" postgres >"$WORK/pgi-$path.log" 2>&1 || echo "pair-guest: pgbench -i failed: $(tail -c 200 "$WORK/pgi-$path.log")" >&2
          for mode in select-only tpcb; do
            flag=(); [ $mode = select-only ] && flag=(-S)
            cpu_begin
            out=$("${pre[@]}" timeout 300 pgbench -c 4 -j 2 -T "$PG_T" "${flag[@]}" -r "${pg[@]}" postgres 2>&1)
            awk -v c="$path" -v w="pgbench-$mode" '/^tps = / { t = $3 } /^latency average/ { l = $4 }
              END { printf "rps cell=%s what=%s value=%s lat_avg_ms=%s\n", c, w, t, l }' <<<"$out" >>"$data"
            cpu_end "$path" "pgbench-$mode" "$(awk -F': ' '/^number of transactions actually processed/ { print $2 }' <<<"$out")"
          done
          ;;
        redis)
          cpu_begin
          out=$("${pre[@]}" timeout 300 redis-benchmark -h "$RDMA_VM_PEER" -p 7631 -c 8 -n 20000 -t set,get -q 2>&1 | tr '\r' '\n')
          for t in SET GET; do
            awk -v c="$path" -v t=$t -v w="redis-${t,,}" '$1 == t ":" && $3 == "requests" { r = $2; p = $(NF - 1); sub(/^p50=/, "", p) }
              END { printf "rps cell=%s what=%s value=%s p50=%s\n", c, w, r, p }' <<<"$out" >>"$data"
          done
          cpu_end "$path" redis-set+get 40000
          ;;
        memcached)
          for t in set get; do
            cpu_begin
            # memcslap: "Time to set 16000 keys by 8 threads: 1.234 seconds." (get runs after a load)
            out=$("${pre[@]}" timeout 300 memcslap --servers="$RDMA_VM_PEER:7641" --concurrency=8 --execute-number=2000 --test=$t 2>&1)
            awk -v c="$path" -v w="memcached-$t" -v t=$t '$1 == "Time" && $3 == t { n = $4; s = $(NF - 1) }
              END { printf "rps cell=%s what=%s value=%.0f\n", c, w, (s > 0 ? n / s : 0) }' <<<"$out" >>"$data"
            cpu_end "$path" "memcached-$t" "$(awk -v t=$t '$1 == "Time" && $3 == t { print $4 }' <<<"$out")"
          done
          ;;
      esac
      pair_signal "cli-$kind-$path"
      echo "pair-guest: $kind $path done" >&2
    done
  done
  for kind in $SERVER_KINDS; do
    json=$("$BIN/rsock" stat --dir "$WORK/cli-$kind" --all --json 2>&1)
    rd=$(python3 -c 'import json,sys; c=[json.loads(l)["conns"] for l in sys.argv[1].splitlines() if l.strip().startswith("{")]; print(sum(x["rdma"] for x in c), sum(x["tcp"] for x in c))' "$json" 2>/dev/null)
    echo "conns cell=$kind-rsock round=servers rdma=${rd% *} tcp=${rd#* }" >>"$data"
  done
}

if [ "$RDMA_VM_NODE" = 1 ]; then
  cpu_answer &
  answerer=$!
  trap 'kill $answerer 2>/dev/null' EXIT
  for c in $CELLS; do
    IFS=: read -r name port kind <<<"$c"
    case $kind in
      rsock) shim "$WORK/$name" "$BIN/pingpong" server "$RDMA_VM_SELF:$port" $(epoll_flag "$name") >"$WORK/$name.out" 2>&1 & ;;
      tcp) "$BIN/pingpong" server "$RDMA_VM_SELF:$port" $(epoll_flag "$name") >"$WORK/$name.out" 2>&1 & ;;
    esac
  done
  for c in $CELLS; do
    IFS=: read -r name port kind <<<"$c"
    [ "$kind" = perftest ] || wait_tcp_listen "$port" 60 || { echo "pair-guest: server $name did not listen" >&2; exit 1; }
  done
  pair_signal servers-up
  for r in $(seq 1 "$ROUNDS"); do
    for c in $CELLS; do
      IFS=: read -r name port kind <<<"$c"
      [ "$kind" = perftest ] || continue
      for s in 64 4096; do
        [ "$name" = send_lat_e ] && [ $s = 4096 ] && continue
        pair_wait "go-$name-$s-$r" 300 || exit 1
        # shellcheck disable=SC2046
        timeout 180 $(perftest_cmd "$name") -d rxe0 -s $s -n "$ITERS" >"$WORK/pt.out" 2>&1 &
        pt=$!
        sleep 2
        pair_signal "up-$name-$s-$r"
        wait $pt
        pair_wait "done-$name-$s-$r" 300
      done
    done
  done
  ((SERVERS)) && serve_servers
  pair_barrier end 600
  exit 0
fi

pair_wait servers-up 300 || exit 1
mkdir -p "$OUT"
data=$OUT/data.txt
: >"$data"
# What each node spends while nothing is measured (the bed's own bookkeeping, node 1 waiting
# for the next signal): the report takes it off every measurement, per second it lasted.
cpu_begin
sleep 10
cpu_end idle idle 1
for r in $(seq 1 "$ROUNDS"); do
  for c in $CELLS; do
    IFS=: read -r name port kind <<<"$c"
    case $kind in
      rsock | tcp)
        rxe_counters_snapshot "$WORK/c"
        cpu_begin
        run=("$BIN/pingpong" client "$RDMA_VM_PEER:$port" --size 64,4096 --iters "$ITERS" --warmup $WARM --label "$name" $(epoll_flag "$name"))
        if [ "$kind" = rsock ]; then out=$(shim "$WORK/$name-cli-$r" "${run[@]}"); else out=$("${run[@]}"); fi
        d=$(rxe_counters_delta "$WORK/c")
        echo "$out" | awk -v c="$name" -v r="$r" '$1 == "pingpong" {
          for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
          printf "lat cell=%s size=%s round=%s median_us=%s p99_us=%s cli_csw_rt=%s srv_csw_rt=%s\n", c, v["size"], r, v["median_us"], v["p99_us"], v["cli_csw_rt"], v["srv_csw_rt"] }' >>"$data"
        rts=$((2 * (ITERS + WARM)))
        cpu_end "$name" "pingpong-r$r" $rts
        ;;
      perftest)
        rts=0
        rxe_counters_snapshot "$WORK/c"
        cpu_begin
        for s in 64 4096; do
          [ "$name" = send_lat_e ] && [ $s = 4096 ] && continue
          pair_signal "go-$name-$s-$r"
          pair_wait "up-$name-$s-$r" 120 || exit 1
          # shellcheck disable=SC2046
          line=$(timeout 180 $(perftest_cmd "$name") -d rxe0 -s $s -n "$ITERS" "$RDMA_VM_PEER" 2>&1 | awk -v s=$s '$1 == s')
          pair_signal "done-$name-$s-$r"
          # t_typical and the 99th percentile are half round trips: doubled, like for like.
          awk -v c="$name" -v s=$s -v r="$r" '{ printf "lat cell=%s size=%s round=%s median_us=%.1f p99_us=%.1f\n", c, s, r, 2 * $5, 2 * $8 }' <<<"$line" >>"$data"
          rts=$((rts + ITERS))
          sleep 1
        done
        d=$(rxe_counters_delta "$WORK/c")
        cpu_end "$name" "pingpong-r$r" $rts
        ;;
    esac
    sent=$(awk '$1 == "sent_pkts" { print $2 }' <<<"$d")
    rcvd=$(awk '$1 == "rcvd_pkts" { print $2 }' <<<"$d")
    [ "$kind" = tcp ] || echo "pkts cell=$name round=$r rts=$rts sent=${sent:-0} rcvd=${rcvd:-0}" >>"$data"
    echo "pair-guest: round $r $name done" >&2
  done
done
((SERVERS)) && client_servers
# rsock's own counters: every client process of an rsock cell had its connection on
# RDMA and none on TCP (a figure secretly measured over TCP would be worthless).
for r in $(seq 1 "$ROUNDS"); do
  for name in rsock rsock-epoll rsock-nospin; do
    json=$("$BIN/rsock" stat --dir "$WORK/$name-cli-$r" --all --json 2>&1)
    rd=$(sed -n 's/.*"conns":{"rdma":\([0-9]*\),"tcp":\([0-9]*\).*/\1 \2/p' <<<"$json" | head -1)
    echo "conns cell=$name round=$r rdma=${rd% *} tcp=${rd#* }" >>"$data"
  done
done
pair_barrier end 600
