#!/usr/bin/env bash
# Prove the test bed works. Runs INSIDE the guest:
#
#   tests/rdma-vm/run.sh -- tests/rdma-vm/smoke.sh
#
# Checks: rxe0 PORT_ACTIVE for verbs; memlock unlimited; rping (rdma_cm + RC SEND/RDMA)
# both ways; ib_write_bw over rdma_cm; rxe0's packet counters moved; no RC QP left
# behind; and, in namespace plain: TCP reaches 10.77.0.1, RDMA does not (both with
# /dev/infiniband hidden and with it visible). Prints PASS/FAIL per check and
# "N passed, N failed, N skipped"; exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=lib.sh
T_TIMEOUT=${T_TIMEOUT:-90}
source tests/rdma-vm/lib.sh
rdma_vm_require_guest
A=$RDMA_VM_ADDR

echo "== rdma-vm smoke: $(uname -r), topology ${RDMA_VM_TOPOLOGY:-?}, $(nproc) vCPU"
rxe_counters_snapshot /tmp/smoke-counters.before

check_port_active() {
  ibv_devinfo -d rxe0 | tee /dev/stderr | grep -q 'state:.*PORT_ACTIVE'
}
t_check "ibv_devinfo: rxe0 PORT_ACTIVE" check_port_active

check_memlock() { [[ $(ulimit -l) == unlimited ]]; }
t_check "RLIMIT_MEMLOCK unlimited" check_memlock

if [[ ${RDMA_VM_TOPOLOGY:-} == pair ]]; then
  # Two guests: node 0 serves on its rxe0, node 1 connects from its own rxe0 across the
  # emulated wire, once node 0 signals that its listener is up.
  check_pair_rping() {
    local srv rc=0
    if ((RDMA_VM_NODE == 0)); then
      rping -s -a "$RDMA_VM_SELF" -p 7471 -C 10 -v >/tmp/rping-server.log 2>&1 &
      srv=$!
      wait_rdma_listen 7471 30 || return 1
      pair_signal rping-listening
      wait "$srv" || rc=$?
      tail -n 3 /tmp/rping-server.log
      return "$rc"
    else
      pair_wait rping-listening 80 || return 1
      rping -c -a "$RDMA_VM_PEER" -p 7471 -C 10 -v
    fi
  }
  t_check "pair: rping node1 -> node0, -C 10" check_pair_rping

  check_pair_write_bw() {
    local srv rc=0
    if ((RDMA_VM_NODE == 0)); then
      ib_write_bw -R -d rxe0 -p 18515 -s 65536 -n 400 >/tmp/ibwbw-server.log 2>&1 &
      srv=$!
      wait_rdma_listen 18515 30 || return 1
      pair_signal write-bw-listening
      wait "$srv" || rc=$?
      cat /tmp/ibwbw-server.log
      ((rc == 0)) && grep -qE '^ *65536 +400 ' /tmp/ibwbw-server.log
    else
      pair_wait write-bw-listening 80 || return 1
      ib_write_bw -R -d rxe0 -p 18515 -s 65536 -n 400 "$RDMA_VM_PEER"
    fi
  }
  t_check "pair: ib_write_bw -R node1 -> node0" check_pair_write_bw
else
  check_rping() {
    local srv rc=0
    rping -s -a "$A" -p 7471 -C 10 -v >/tmp/rping-server.log 2>&1 &
    srv=$!
    wait_rdma_listen 7471 30 || return 1
    rping -c -a "$A" -p 7471 -C 10 -v || rc=$?
    wait "$srv" || { echo "rping server failed:"; cat /tmp/rping-server.log; return 1; }
    echo "server: $(grep -c 'server ping data' /tmp/rping-server.log) pings"
    return "$rc"
  }
  t_check "rping -s / rping -c -C 10 -v" check_rping

  check_write_bw() {
    local srv rc=0
    ib_write_bw -R -d rxe0 -p 18515 -s 65536 -n 400 >/tmp/ibwbw-server.log 2>&1 &
    srv=$!
    wait_rdma_listen 18515 30 || return 1
    ib_write_bw -R -d rxe0 -p 18515 -s 65536 -n 400 "$A" || rc=$?
    wait "$srv" || { echo "ib_write_bw server failed:"; cat /tmp/ibwbw-server.log; return 1; }
    ((rc == 0)) || return "$rc"
    # The result line: bytes, iterations, BW peak, BW average, MsgRate.
    grep -E '^ *65536 +400 ' /tmp/ibwbw-server.log
  }
  t_check "ib_write_bw -R (server + client)" check_write_bw
fi

check_counters() {
  rxe_counters_delta /tmp/smoke-counters.before
  # ib_write_bw moved 400 x 64 KiB: at least that many bytes / active_mtu packets.
  local mtu
  mtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu/ { print $2; exit }')
  echo "active_mtu $mtu"
  (($(rxe_counter sent_pkts) + $(rxe_counter rcvd_pkts) >= 400 * 65536 / mtu))
}
t_check "rxe0 hw_counters moved (sent/rcvd_pkts)" check_counters

check_no_qp_left() {
  # QPs are destroyed asynchronously after the programs exit.
  wait_qp_count 0 20
}
t_check "no RC QP left behind" check_no_qp_left

if ip netns list 2>/dev/null | grep -q '^plain'; then
  check_plain_tcp() {
    local srv
    nc -l "$A" 7000 >/tmp/plain-tcp.out &
    srv=$!
    wait_tcp_listen 7000 30 || return 1
    echo "hello from plain" | in_plain nc -N "$A" 7000 || return 1
    wait "$srv"
    grep -qx "hello from plain" /tmp/plain-tcp.out
  }
  t_check "plain: TCP to $A works" check_plain_tcp

  # An rdma_cm client in plain must fail quickly, however it is asked.
  check_plain_no_rdma() {
    local srv rc=0 mode
    rping -s -a "$A" -p 7472 -v >/tmp/rping-plain-server.log 2>&1 &
    srv=$!
    wait_rdma_listen 7472 30 || return 1
    for mode in hidden --rdma-dev; do
      rc=0
      if [[ $mode == hidden ]]; then
        timeout 30 "$RDMA_VM_LIB_DIR/in-plain.sh" rping -c -a "$A" -p 7472 -C 1 -v || rc=$?
      else
        timeout 30 "$RDMA_VM_LIB_DIR/in-plain.sh" --rdma-dev rping -c -a "$A" -p 7472 -C 1 -v || rc=$?
      fi
      echo "rping from plain ($mode): status $rc"
      ((rc != 0 && rc != 124)) || { kill "$srv"; return 1; }
    done
    # ... while the same server is still reachable over RDMA from the initial namespace.
    rping -c -a "$A" -p 7472 -C 1 -v || { kill "$srv"; return 1; }
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    return 0
  }
  t_check "plain: RDMA to $A fails" check_plain_no_rdma

  check_plain_no_devices() {
    in_plain ibv_devinfo && return 1
    return 0
  }
  t_check "plain: no RDMA device visible" check_plain_no_devices
else
  t_skip "plain namespace checks" "topology ${RDMA_VM_TOPOLOGY:-?} has no namespace plain"
fi

echo "-- rxe0 counters (delta over the smoke run):"
rxe_counters_delta /tmp/smoke-counters.before | sed 's/^/   /'
t_summary
