#!/usr/bin/env bash
# Guest-side test of the RDMA layer (src/rdma) on the test bed's Soft-RoCE device.
#
#   cargo build --release --examples && tests/rdma-vm/run.sh -- tests/rdma/verbs.sh
#
# First perftest (ib_write_lat -R 64 B / 4 KiB, ib_write_bw -R) on the link, for reference;
# then examples/rdma_pingpong (server + client on the same rxe0 address):
#   1. busy-polling run: connection with private data, 64 B / 4 KiB ping-pong latency,
#      streaming with credits, checksums compared;
#   2. the same with --events (completion channel instead of busy polling);
#   3. fallback reasons: server rejects (with private data) or no listener -> "rejected";
#      no such host -> "unreachable"/"timeout";
# and, for runs 1-2, while both processes are still alive after their teardown
# (--linger), that the kernel lists no QP/CQ/MR/PD/cm_id of theirs; after all runs, no
# RC QP at all. Last, the rsock/perftest ratios (same boot). Prints PASS/FAIL lines and
# "N passed, N failed". Figures under TCG vary a lot between runs (medians drop into a
# millisecond mode when the host is loaded): compare ratios from one boot only.
#
# Environment: RDMA_TEST_ADDR (10.77.0.1), RDMA_TEST_ITERS (1000), RDMA_TEST_BYTES (32M),
# RDMA_TEST_SIZE (65536), RDMA_TEST_RING (4M, receive ring = credit window),
# RDMA_TEST_TIMEOUT (240 s per program), RDMA_TEST_PERFTEST (1), RDMA_TEST_ROUNDS (0:
# extra alternating latency rounds, perftest then rsock, 300 iterations each, to see the
# spread of the ratio within one boot).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1

BIN=${RDMA_PINGPONG:-target/release/examples/rdma_pingpong}
ADDR=${RDMA_TEST_ADDR:-10.77.0.1}
ITERS=${RDMA_TEST_ITERS:-1000}
BYTES=${RDMA_TEST_BYTES:-32M}
SIZE=${RDMA_TEST_SIZE:-65536}
RING=${RDMA_TEST_RING:-4M}
TMO=${RDMA_TEST_TIMEOUT:-240}
PERF=${RDMA_TEST_PERFTEST:-1}
ROUNDS=${RDMA_TEST_ROUNDS:-0}
OUT=$(mktemp -d /tmp/rdma-verbs.XXXXXX)
pass=0 fail=0
ok() { echo "PASS $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
log() { echo "# $*"; }

ulimit -l unlimited 2>/dev/null || log "could not raise RLIMIT_MEMLOCK ($(ulimit -l))"

if [[ ! -x $BIN ]]; then
  bad "setup: $BIN missing (cargo build --release --examples)"
  echo "$pass passed, $fail failed"
  exit 1
fi
if ! rdma link show 2>/dev/null | grep -q ACTIVE; then
  bad "setup: no ACTIVE rdma link"
  echo "$pass passed, $fail failed"
  exit 1
fi

# wait_listener PORT PID: until an rdma_cm id of PID is in state LISTEN on PORT.
wait_listener() {
  local port=$1 pid=$2 i
  for ((i = 0; i < 600; i++)); do
    rdma res show cm_id 2>/dev/null | grep "state LISTEN" | grep -q "src-addr [^ ]*:$port " && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# wait_line FILE REGEX PID: until FILE has a line matching REGEX (or PID exits). Uses
# bash builtins and a slow poll: a fork every 100 ms (grep, sleep) costs enough CPU under
# TCG to disturb the latency measurement running at the same time on two vCPUs.
has_line() {
  local line
  while IFS= read -r line; do [[ $line =~ $2 ]] && return 0; done <"$1"
  return 1
}
wait_line() {
  local f=$1 re=$2 pid=$3 i
  for ((i = 0; i < TMO; i++)); do
    has_line "$f" "$re" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { has_line "$f" "$re" 2>/dev/null; return; }
    sleep 1
  done
  return 1
}

# objects_of PID: "qp=N cq=N mr=N pd=N cm_id=N" the kernel lists for PID.
objects_of() {
  local pid=$1 r n s=""
  for r in qp cq mr pd cm_id; do
    n=$(rdma res show "$r" 2>/dev/null | grep -c -w "pid $pid")
    s+="$r=$n "
  done
  echo "${s% }"
}

# run_pair NAME PORT [CLIENT ARGS...]
run_pair() {
  local name=$1 port=$2
  shift 2
  local slog=$OUT/$name.server.log clog=$OUT/$name.client.log spid cpid src crc
  timeout "$TMO" "$BIN" server "$ADDR" "$port" --timeout "$TMO" --linger 8 >"$slog" 2>&1 &
  spid=$!
  if ! wait_listener "$port" "$spid"; then
    bad "$name: server did not listen"; sed 's/^/#   server: /' "$slog"; kill "$spid" 2>/dev/null; return
  fi
  timeout "$TMO" "$BIN" client "$ADDR" "$port" --timeout "$TMO" --linger 8 "$@" >"$clog" 2>&1 &
  cpid=$!
  local p tag log
  for tag in client server; do
    [[ $tag == client ]] && { p=$cpid; log=$clog; } || { p=$spid; log=$slog; }
    if wait_line "$log" '^LINGER pid=' "$p"; then
      local objs
      objs=$(objects_of "$p")
      if [[ $objs == "qp=0 cq=0 mr=0 pd=0 cm_id=0" ]]; then
        ok "$name: $tag released every RDMA object after teardown ($objs)"
      else
        bad "$name: $tag still holds RDMA objects after teardown ($objs)"
      fi
    else
      bad "$name: $tag did not reach teardown"
    fi
  done
  wait "$cpid"; crc=$?
  wait "$spid"; src=$?
  sed 's/^/#   client: /' "$clog"
  sed 's/^/#   server: /' "$slog"
  [[ $crc == 0 ]] && ok "$name: client exit 0" || bad "$name: client exit $crc"
  [[ $src == 0 ]] && ok "$name: server exit 0" || bad "$name: server exit $src"
  local cs ss ssrv
  cs=$(sed -n 's/^checksum client=\([0-9a-f]*\) server=.*/\1/p' "$clog")
  ss=$(sed -n 's/^checksum client=[0-9a-f]* server=\([0-9a-f]*\)$/\1/p' "$clog")
  ssrv=$(sed -n 's/.*bytes in [0-9]* chunks, checksum=\([0-9a-f]*\)$/\1/p' "$slog")
  if [[ -n $cs && $cs == "$ss" && $cs == "$ssrv" ]]; then
    ok "$name: stream checksums match (client=$cs server=$ssrv)"
  else
    bad "$name: stream checksums client='$cs' reported='$ss' server='$ssrv'"
  fi
  grep -q "^close: drained" "$clog" && grep -q "^close: drained" "$slog" \
    && ok "$name: both sides drained their QP before destroying it" \
    || bad "$name: a side did not drain its QP in time"
  grep '^RESULT' "$clog" | sed "s/^RESULT/RESULT $name/"
}

# expect_failure NAME REASON_REGEX CLIENT ARGS...: the client must exit 1 naming the reason.
expect_failure() {
  local name=$1 re=$2 rc t0 t1
  shift 2
  t0=$(date +%s.%N)
  timeout "$TMO" "$BIN" client "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  sed 's/^/#   /' "$OUT/$name.log"
  if [[ $rc == 1 ]] && grep -Eq "$re" "$OUT/$name.log"; then
    ok "$name: failed cleanly as expected (exit $rc, $(awk "BEGIN{printf \"%.2f\", $t1-$t0}") s)"
  else
    bad "$name: exit $rc, expected 1 with /$re/"
  fi
}

# perftest on the same link, same boot.
perf_run() { # NAME PORT TOOL ARGS...: server + client; prints the client's output
  local name=$1 port=$2 tool=$3 spid
  shift 3
  timeout "$TMO" "$tool" -R -p "$port" "$@" >"$OUT/$name.server.log" 2>&1 &
  spid=$!
  if ! wait_listener "$port" "$spid"; then
    echo "# $name: perftest server did not listen"; kill "$spid" 2>/dev/null; return 1
  fi
  timeout "$TMO" "$tool" -R -p "$port" "$@" "$ADDR" >"$OUT/$name.client.log" 2>&1
  local rc=$?
  wait "$spid"
  if ((rc != 0)); then
    echo "# $name: client exit $rc"
    # stderr is unbuffered, stdout is not: errors come first in these files.
    sed 's/^/#   client: /' "$OUT/$name.client.log" | grep -v -E 'GID|address|-----' | tail -30
    sed 's/^/#   server: /' "$OUT/$name.server.log" | grep -v -E 'GID|address|-----' | tail -30
  fi
  sed 's/^/#   /' "$OUT/$name.client.log" | grep -E '^#   +[0-9]+ +[0-9]+' || true
  return $rc
}

perftest_measure() {
  for s in 64 4096; do
    if perf_run "lat$s" $((18515 + s % 1000)) ib_write_lat -s "$s" -n "$ITERS" \
      || { log "retrying ib_write_lat -s $s once"; perf_run "lat$s" $((18530 + s % 1000)) ib_write_lat -s "$s" -n "$ITERS"; }; then
      # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
      read -r _ _ _ _ typ avg _ < <(grep -E "^ +$s +[0-9]+" "$OUT/lat$s.client.log" | head -1)
      PT[lat$s.typ]=$typ PT[lat$s.avg]=$avg
      ok "perftest ib_write_lat -R -s $s: t_typical=${typ} us t_avg=${avg} us"
    else
      bad "perftest ib_write_lat -s $s did not run"
    fi
  done
  bytes=$(numfmt --from=iec "$BYTES" 2>/dev/null || echo 33554432)
  n=$((bytes / SIZE)); ((n < 100)) && n=100
  if perf_run bw 18600 ib_write_bw -s "$SIZE" -n "$n" \
    || { log "retrying ib_write_bw once"; perf_run bw 18601 ib_write_bw -s "$SIZE" -n "$n"; }; then
    # #bytes #iterations BW_peak BW_average MsgRate  (MB/sec)
    read -r _ _ _ bwavg _ < <(grep -E "^ +$SIZE +[0-9]+" "$OUT/bw.client.log" | head -1)
    PT[bw]=$bwavg
    ok "perftest ib_write_bw -R -s $SIZE -n $n: BW average ${bwavg} MB/sec"
  else
    bad "perftest ib_write_bw did not run"
  fi
}

log "rsock rdma layer test on $(rdma link show | head -1)"
if tests/rdma/needed.sh "$BIN" | sed 's/^/#   /'; then
  ok "$BIN has no load-time dependency on libibverbs/librdmacm"
else
  bad "$BIN depends on libibverbs/librdmacm at load time"
fi
declare -A PT
if [[ $PERF == 1 ]] && command -v ib_write_lat >/dev/null; then
  perftest_measure   # first: the figures to compare with, in the same boot
fi
run_pair poll 7471 --iters "$ITERS" --bytes "$BYTES" --size "$SIZE" --ring "$RING"
run_pair events 7472 --iters "$((ITERS / 5 > 0 ? ITERS / 5 : 1))" --bytes "$BYTES" --size "$SIZE" --ring "$RING" --events
timeout "$TMO" "$BIN" server "$ADDR" 7473 --reject --timeout "$TMO" >"$OUT/reject.server.log" 2>&1 &
rpid=$!
if wait_listener 7473 "$rpid"; then
  expect_failure reject '\(errno 111, rejected\)' "$ADDR" 7473 --iters 1 --bytes 8 --size 8 --timeout 60
  grep -q 'peer private data: "RSPP:reject:test"' "$OUT/reject.log" \
    && ok "reject: the client got the server's reject private data" \
    || bad "reject: reject private data not seen by the client"
else
  bad "reject: server did not listen"
fi
wait "$rpid"
expect_failure no-listener '\(errno 111, rejected\)' "$ADDR" 7479 --iters 1 --bytes 8 --size 8 --timeout 60
expect_failure no-host '(unreachable|timeout)\)' 10.77.0.99 7479 --iters 1 --bytes 8 --size 8 --timeout 8

# Alternating latency rounds: perftest, then rsock, same sizes, 300 iterations each.
for ((r = 1; r <= ROUNDS; r++)); do
  line="ROUND $r one-way median us (rsock/perftest):"
  declare -A RP=()
  for s in 64 4096; do
    if perf_run "r$r-lat$s" $((18700 + r * 10 + s % 7)) ib_write_lat -s "$s" -n 300 >/dev/null; then
      read -r _ _ _ _ typ _ < <(grep -E "^ +$s +[0-9]+" "$OUT/r$r-lat$s.client.log" | head -1)
      RP[$s]=$typ
    fi
  done
  port=$((7500 + r))
  timeout "$TMO" "$BIN" server "$ADDR" "$port" --timeout "$TMO" >"$OUT/r$r.server.log" 2>&1 &
  spid=$!
  if wait_listener "$port" "$spid"; then
    timeout "$TMO" "$BIN" client "$ADDR" "$port" --timeout "$TMO" --iters 300 --bytes 64K --size 65536 --ring 1M \
      >"$OUT/r$r.client.log" 2>&1
  fi
  wait "$spid"
  for s in 64 4096; do
    med=$(sed -n "s/^RESULT lat size=$s .*one_way_us median=\([0-9.]*\) avg=.*/\1/p" "$OUT/r$r.client.log")
    if [[ -n $med && -n ${RP[$s]:-} ]]; then
      line+=" ${s}B ${med}/${RP[$s]}=$(awk "BEGIN{printf \"%.2f\", $med/${RP[$s]}}")"
    else
      line+=" ${s}B n/a"
    fi
  done
  echo "$line"
done

sleep 1
left=$(rdma res show qp 2>/dev/null | grep -v "type GSI" | grep -c "type")
[[ $left == 0 ]] && ok "no RC QP left after all programs exited" \
  || { bad "$left QP(s) left after all programs exited"; rdma res show qp | sed 's/^/#   /'; }
left=$(rdma res show cm_id 2>/dev/null | grep -c .)
[[ $left == 0 ]] && ok "no cm_id left after all programs exited" \
  || { bad "$left cm_id(s) left"; rdma res show cm_id | sed 's/^/#   /'; }

if ((${#PT[@]})); then
  # Ratios rsock layer / perftest (latency: one-way median vs t_typical, avg vs t_avg;
  # bandwidth: MB/s (10^6) vs perftest's MB/sec (2^20 bytes)).
  for s in 64 4096; do
    line=$(grep "RESULT lat size=$s " "$OUT/poll.client.log" | head -1)
    med=$(sed -n 's/.*one_way_us median=\([0-9.]*\) avg=.*/\1/p' <<<"$line")
    av=$(sed -n 's/.*one_way_us median=[0-9.]* avg=\([0-9.]*\)$/\1/p' <<<"$line")
    if [[ -n $med && -n ${PT[lat$s.typ]:-} ]]; then
      echo "RATIO lat $s B one-way: rsock median ${med} us / perftest t_typical ${PT[lat$s.typ]} us = $(awk "BEGIN{printf \"%.2f\", $med/${PT[lat$s.typ]}}"); avg ${av} / ${PT[lat$s.avg]} = $(awk "BEGIN{printf \"%.2f\", $av/${PT[lat$s.avg]}}")"
    fi
  done
  for run in poll events; do
    mbps=$(sed -n 's/^RESULT bw .* MBps=\([0-9.]*\) .*/\1/p' "$OUT/$run.client.log")
    if [[ -n $mbps && -n ${PT[bw]:-} ]]; then
      echo "RATIO bw $SIZE B ($run): rsock ${mbps} MB/s / perftest $(awk "BEGIN{printf \"%.2f\", ${PT[bw]}*1.048576}") MB/s = $(awk "BEGIN{printf \"%.2f\", $mbps/(${PT[bw]}*1.048576)}")"
    fi
  done
fi

if dmesg 2>/dev/null | grep -E "WARNING|BUG:|rxe.*(error|fail)" >"$OUT/dmesg.txt"; then
  echo "# kernel messages:"; sed 's/^/#   /' "$OUT/dmesg.txt"
fi
echo "$pass passed, $fail failed"
((fail == 0))
