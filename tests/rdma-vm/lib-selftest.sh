#!/usr/bin/env bash
# Tests of lib.sh's helpers. Runs INSIDE the guest (topology plain):
#
#   tests/rdma-vm/run.sh -- tests/rdma-vm/lib-selftest.sh
#
# (selftest.sh runs it.) Closing line: "N passed, N failed, N skipped".
# shellcheck disable=SC2034 # T_* are read by lib.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
T_TIMEOUT=60
# shellcheck source=lib.sh
source tests/rdma-vm/lib.sh
rdma_vm_require_guest
A=$RDMA_VM_ADDR

# Did CMD finish within SECS seconds, with status WANT?
within() {
  local secs=$1 want=$2 rc=0 t0=$SECONDS
  shift 2
  "$@" || rc=$?
  echo "status $rc after $((SECONDS - t0))s"
  ((rc == want && SECONDS - t0 <= secs))
}

check_wait_tcp_listen() {
  nc -l "$A" 7100 >/dev/null &
  within 30 0 wait_tcp_listen 7100 30 || return 1
  within 20 1 wait_tcp_listen 7101 2 || return 1
  ip netns exec plain nc -l "$RDMA_VM_PLAIN_ADDR" 7102 >/dev/null &
  within 30 0 wait_tcp_listen 7102 30 plain || return 1
  # Not listening in the initial namespace.
  within 20 1 wait_tcp_listen 7102 1
}
t_check "wait_tcp_listen (+ timeout, + netns)" check_wait_tcp_listen

check_rdma_helpers() {
  local srv cli before
  rping -s -P -a "$A" -p 7103 >/dev/null 2>&1 &
  srv=$!
  within 30 0 wait_rdma_listen 7103 30 || return 1
  within 20 1 wait_rdma_listen 7104 2 || return 1
  before=$(rxe_counter sent_pkts)
  rping -c -a "$A" -p 7103 >/dev/null 2>&1 &   # pings until killed
  cli=$!
  wait_cond 30 '(( $(rdma_qp_count RC) >= 2 ))' || { rdma resource show qp; return 1; }
  echo "RC QPs with a connection up: $(rdma_qp_count RC), cm_ids: $(rdma_cm_id_count)"
  (($(rdma_cm_id_count) >= 3)) || return 1
  (($(rdma_qp_count all) > $(rdma_qp_count RC))) || return 1  # + the GSI QP
  wait_cond 30 "(( \$(rxe_counter sent_pkts) > $before ))" || return 1
  # wait_until expands its arguments once: this must time out.
  within 20 1 wait_until 2 test "$(rdma_qp_count RC)" = 0 || return 1
  kill "$cli"
  wait "$cli"
  wait_qp_count 0 30 || return 1
  echo "after the client: RC QPs $(rdma_qp_count RC), cm_ids $(rdma_cm_id_count)"
  kill "$srv"
  wait "$srv"
  return 0
}
t_check "wait_rdma_listen, rdma_qp_count, rdma_cm_id_count" check_rdma_helpers

check_counters() {
  rxe_counters_snapshot /tmp/lib-selftest.counters
  rping -s -a "$A" -p 7105 -C 3 >/dev/null 2>&1 &
  wait_rdma_listen 7105 30 || return 1
  rping -c -a "$A" -p 7105 -C 3 || return 1
  wait
  rxe_counters | grep -q '^sent_pkts [0-9]' || return 1
  rxe_counters_delta /tmp/lib-selftest.counters | tee /dev/stderr | grep -q '^sent_pkts [1-9]' || return 1
  rxe_show_counters | grep -q 'link rxe0/1 .*sent_pkts'
}
t_check "rxe_counters, _snapshot, _delta, rxe_show_counters" check_counters

check_runner() {
  local out
  # A failing check is counted and its log shown; a hanging one is killed at T_TIMEOUT.
  out=$(T_PASSED=0 T_FAILED=0 T_LOGDIR=/tmp/inner
    t_check "inner fails" bash -c 'echo inner-log-line; exit 5'
    T_TIMEOUT=2 t_check "inner hangs" sleep 61
    t_check "inner passes" true
    t_summary; echo "summary status $?")
  echo "$out"
  local want
  for want in '^FAIL  inner fails .*status 5' 'inner-log-line' \
    '^FAIL  inner hangs .*timed out after 2s' '^PASS  inner passes' \
    '^1 passed, 2 failed, 0 skipped$' '^summary status 1$'; do
    grep -q -- "$want" <<<"$out" || { echo "missing: $want"; return 1; }
  done
  # No sleep 61 left behind by the hung check.
  if pgrep -x -f 'sleep 61'; then
    echo "left behind:"; ps -eo pid,pgid,ppid,stat,args | grep -v grep | grep 'sleep 61'
    return 1
  fi
}
t_check "t_check: failure, timeout, summary" check_runner

check_bg() {
  t_bg srv nc -l "$A" 7106
  local pid=$T_PID
  wait_tcp_listen 7106 30 || return 1
  t_stop "$pid"
  ! kill -0 "$pid" 2>/dev/null && [[ -z $(ss -Hltn "sport = :7106") ]]
}
t_check "t_bg / t_stop" check_bg

check_retry() {
  within 20 1 retry 2 false || return 1
  within 20 0 retry 2 true || return 1
  [[ $(retry 2 echo hello) == hello ]]
}
t_check "retry" check_retry

check_in_plain() {
  in_plain ip -o -4 addr show | grep -q "$RDMA_VM_PLAIN_ADDR/24" || return 1
  in_plain test ! -e /dev/infiniband/rdma_cm || return 1
  "$RDMA_VM_LIB_DIR/in-plain.sh" --rdma-dev test -e /dev/infiniband/rdma_cm || return 1
  # The initial namespace still has its device nodes.
  test -e /dev/infiniband/rdma_cm
}
t_check "in_plain / in-plain.sh --rdma-dev" check_in_plain

t_summary
