# shellcheck shell=bash disable=SC2034
# Guest-side helpers for test scripts run with tests/rdma-vm/run.sh. Source it:
#   source tests/rdma-vm/lib.sh
#
# Waiting (never sleep a fixed time for a server: under TCG programs start slowly):
#   wait_tcp_listen PORT [TIMEOUT_S=60] [NETNS]   a kernel TCP listener on PORT
#   wait_rdma_listen PORT [TIMEOUT_S=60]          an rdma_cm listener (cm_id LISTEN) on PORT
#   wait_until TIMEOUT_S CMD [ARGS...]            CMD succeeds (polled every 0.1 s; the
#                                                 arguments are expanded once)
#   wait_cond TIMEOUT_S 'SHELL EXPR'              EXPR (re-evaluated) succeeds
#   retry TIMEOUT_S CMD [ARGS...]                 rerun CMD until it succeeds (0.5 s apart),
#                                                 e.g. a client whose server is in the
#                                                 other guest (topology pair)
# Device state:
#   rdma_qp_count [TYPE=RC|UD|GSI|all]            QPs listed by `rdma resource show qp`
#   wait_qp_count N [TIMEOUT_S=30] [TYPE=RC]      exactly N QPs of TYPE exist
#   rdma_cm_id_count                              cm_ids listed by `rdma resource show cm_id`
#   rxe_counters [DEV=rxe0]                       "name value" lines of the port's hw_counters
#   rxe_counter NAME [DEV=rxe0]                   one counter's value
#   rxe_counters_snapshot FILE [DEV]              save the counters
#   rxe_counters_delta FILE [DEV]                 "name delta" for counters that changed
#   rxe_show_counters [DEV]                       `rdma statistic show` (all counters)
# Topology:
#   in_plain CMD [ARGS...]                        run CMD in namespace "plain" (in-plain.sh)
#   RDMA_VM_ADDR                                  10.77.0.1 (veth0, carries rxe0)
#   RDMA_VM_PLAIN_ADDR                            10.77.0.2 (veth1 in namespace plain)
#   RDMA_VM_NODE, RDMA_VM_SELF, RDMA_VM_PEER      topology pair: 0/1, 10.77.1.1/10.77.1.2
#   pair_signal NAME / pair_wait NAME [TIMEOUT_S=120]   topology pair: sync the two nodes
#   pair_barrier NAME [TIMEOUT_S=120]             topology pair: both nodes meet here
# Tiny test runner (prints PASS/FAIL per check and a closing "N passed, N failed"):
#   t_check NAME CMD [ARGS...]   run CMD (output to a log, shown on failure)
#   t_skip NAME REASON
#   t_bg NAME CMD [ARGS...]      start CMD in the background, in its own process group,
#                                output to T_LOGDIR/NAME.log; sets T_PID (killed at exit)
#   t_stop PID                   stop a t_bg group; returns its exit status
#   t_summary                    print the totals; returns 1 if anything failed
# CMD may be a shell function. Variables: T_LOGDIR (default /tmp/rdma-vm-tests),
# T_TIMEOUT (per check, default 120 s). lib.sh sets an EXIT trap (kills t_bg groups).

RDMA_VM_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RDMA_VM_ADDR=10.77.0.1
RDMA_VM_PLAIN_ADDR=10.77.0.2
T_LOGDIR=${T_LOGDIR:-/tmp/rdma-vm-tests}
T_TIMEOUT=${T_TIMEOUT:-120}
T_PASSED=0 T_FAILED=0 T_SKIPPED=0
T_BG_PIDS=()

# Refuse to run outside the guest: these helpers assume its devices and namespaces.
rdma_vm_require_guest() {
  if [[ ${RDMA_VM:-} != 1 ]]; then
    echo "$(basename "$0"): runs inside the test-bed guest: tests/rdma-vm/run.sh -- $0" >&2
    exit 2
  fi
}

wait_until() {
  local timeout=$1 end
  shift
  end=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    nap
  done
}

# A tenth of a second without forking: a read that times out on a fifo nobody writes (a
# `sleep` per poll is a fork and an exec, ~10 ms of a TCG guest's CPU each, which the
# benchmarks would count). Falls back to sleep where the fifo cannot be made.
nap() {
  if [[ -z ${_NAP_FD:-} ]]; then
    local f=/tmp/rdma-vm-nap.$BASHPID
    if mkfifo "$f" 2>/dev/null && exec {_NAP_FD}<>"$f"; then rm -f "$f"; else rm -f "$f"; _NAP_FD=none; fi
  fi
  if [[ $_NAP_FD == none ]]; then sleep 0.1; else read -r -t 0.1 -u "$_NAP_FD" || :; fi
}

# Run CMD until it succeeds (output of the last attempt only), every 0.5 s.
retry() {
  local timeout=$1 end out rc
  shift
  end=$((SECONDS + timeout))
  while :; do
    rc=0
    out=$("$@" 2>&1) || rc=$?
    ((rc != 0 && SECONDS < end)) || break
    sleep 0.5
  done
  printf '%s\n' "$out"
  return "$rc"
}

# Like wait_until, but re-evaluates a shell expression each time, e.g.
#   wait_cond 20 '(( $(rdma_qp_count RC) == 0 ))'
# (wait_until's arguments are expanded once, before the first try.)
wait_cond() {
  local timeout=$1 expr=$2 end
  end=$((SECONDS + timeout))
  until eval "$expr" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    sleep 0.1
  done
}

_tcp_listening() {
  local port=$1 ns=${2:-}
  if [[ -n $ns ]]; then
    [[ -n $(ip netns exec "$ns" ss -Hltn "sport = :$port") ]]
  else
    [[ -n $(ss -Hltn "sport = :$port") ]]
  fi
}

wait_tcp_listen() {
  local port=${1:?port} timeout=${2:-60} ns=${3:-}
  wait_until "$timeout" _tcp_listening "$port" "$ns" ||
    { echo "wait_tcp_listen: nothing listens on TCP port $port after ${timeout}s" >&2; return 1; }
}

_rdma_listening() {
  rdma resource show cm_id 2>/dev/null | grep -qE "state LISTEN .*src-addr [^ ]*:$1( |\$)"
}

wait_rdma_listen() {
  local port=${1:?port} timeout=${2:-60}
  wait_until "$timeout" _rdma_listening "$port" ||
    { echo "wait_rdma_listen: no rdma_cm listener on port $port after ${timeout}s" >&2; return 1; }
}

# Topology pair: tell the other node that NAME happened / wait until it did. Use them
# instead of retrying a client (a perftest client that fails to connect can crash and
# leave the server's QP stuck in RNR retries).
pair_signal() { : >"/run/rdma-vm/pair/${1:?name}"; }
pair_wait() {
  local name=${1:?name} timeout=${2:-120}
  wait_until "$timeout" test -e "/run/rdma-vm/pair/$name" ||
    { echo "pair_wait: no signal '$name' from the other node after ${timeout}s" >&2; return 1; }
}

# Both nodes wait here until both arrived (e.g. before the end: a node that finishes
# powers off, and its peer can no longer reach it).
pair_barrier() {
  local name=${1:?name} timeout=${2:-120}
  pair_signal "$name.$RDMA_VM_NODE"
  pair_wait "$name.$((1 - RDMA_VM_NODE))" "$timeout"
}

rdma_qp_count() {
  local type=${1:-RC}
  if [[ $type == all ]]; then
    rdma resource show qp 2>/dev/null | grep -c 'lqpn' || true
  else
    rdma resource show qp 2>/dev/null | grep -c " type $type " || true
  fi
}

# Wait until exactly N QPs of TYPE exist (e.g. 0 after the programs closed theirs:
# the kernel destroys them asynchronously).
wait_qp_count() {
  local n=${1:?count} timeout=${2:-30} type=${3:-RC}
  wait_cond "$timeout" "(( \$(rdma_qp_count $type) == $n ))" || {
    echo "wait_qp_count: $(rdma_qp_count "$type") $type QPs, not $n, after ${timeout}s" >&2
    rdma resource show qp >&2
    return 1
  }
}

rdma_cm_id_count() {
  rdma resource show cm_id 2>/dev/null | grep -c 'cm-idn' || true
}

rxe_counters() {
  local dev=${1:-rxe0} f v
  for f in /sys/class/infiniband/"$dev"/ports/1/hw_counters/*; do
    read -r v <"$f" && printf '%s %s\n' "${f##*/}" "$v"
  done
}

rxe_counter() {
  echo "$(<"/sys/class/infiniband/${2:-rxe0}/ports/1/hw_counters/${1:?counter name}")"
}

rxe_counters_snapshot() { rxe_counters "${2:-rxe0}" >"${1:?file}"; }

rxe_counters_delta() {
  local file=${1:?file} dev=${2:-rxe0}
  rxe_counters "$dev" | awk 'NR == FNR { before[$1] = $2; next }
    $2 != before[$1] { printf "%s %d\n", $1, $2 - before[$1] }' "$file" -
}

rxe_show_counters() { rdma statistic show link "${1:-rxe0}/1"; }

in_plain() { "$RDMA_VM_LIB_DIR/in-plain.sh" "$@"; }

# --- test runner ------------------------------------------------------------------------
_t_log() { mkdir -p "$T_LOGDIR"; printf '%s/%s.log' "$T_LOGDIR" "${1//[^A-Za-z0-9_.-]/_}"; }

# Start "$@" in the background in its own process group (so that a kill reaches
# everything it started); sets _T_PGID.
_t_spawn() {
  local log=$1
  shift
  set -m
  ("$@") </dev/null >"$log" 2>&1 &
  _T_PGID=$!
  set +m
}

t_check() {
  local name=$1 log rc=0 t0=$SECONDS pgid timer done_pid timed_out=0
  shift
  log=$(_t_log "$name")
  _t_spawn "$log" "$@"
  pgid=$_T_PGID
  # Whichever ends first: the check, or a timer (no watchdog process left behind).
  sleep "$T_TIMEOUT" &
  timer=$!
  wait -n -p done_pid "$pgid" "$timer"
  rc=$?
  if [[ $done_pid == "$timer" ]]; then
    timed_out=1
    kill -TERM -- "-$pgid" 2>/dev/null
    sleep 5 &
    timer=$!
    wait -n -p done_pid "$pgid" "$timer"
    [[ $done_pid == "$timer" ]] && kill -KILL -- "-$pgid" 2>/dev/null
    rc=0
    wait "$pgid" || rc=$?
  fi
  kill "$timer" 2>/dev/null
  wait "$timer" 2>/dev/null
  # Whatever the check left running in its group goes too.
  kill -KILL -- "-$pgid" 2>/dev/null
  if ((rc == 0)); then
    T_PASSED=$((T_PASSED + 1))
    printf 'PASS  %-44s (%ds)\n' "$name" $((SECONDS - t0))
  else
    T_FAILED=$((T_FAILED + 1))
    printf 'FAIL  %-44s (%ds, status %d%s)\n' "$name" $((SECONDS - t0)) "$rc" \
      "$( ((timed_out)) && echo ", timed out after ${T_TIMEOUT}s")"
    sed 's/^/      | /' "$log" | tail -n 30
  fi
  return 0
}

t_skip() {
  T_SKIPPED=$((T_SKIPPED + 1))
  printf 'SKIP  %-40s (%s)\n' "$1" "$2"
}

t_bg() {
  local name=$1
  shift
  _t_spawn "$(_t_log "$name")" "$@"
  T_PID=$_T_PGID
  T_BG_PIDS+=("$T_PID")
}

# Stop a t_bg process group (TERM, then KILL after 5 s); returns its exit status.
t_stop() {
  local pid=${1:?pid} rc=0 i
  kill -TERM -- "-$pid" 2>/dev/null
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || rc=$?
  return "$rc"
}

_t_kill_bg() {
  local p
  for p in "${T_BG_PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
}
trap _t_kill_bg EXIT

t_summary() {
  echo "$T_PASSED passed, $T_FAILED failed, $T_SKIPPED skipped"
  ((T_FAILED == 0))
}
