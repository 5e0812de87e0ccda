#!/usr/bin/env bash
# Host-side tests of run.sh itself: exit-status conventions, environment passing,
# timeouts, bed failures, and that no qemu survives; and lib.sh's helpers in the guest
# (lib-selftest.sh). Seven boots, about 4 minutes.
#
#   tests/rdma-vm/selftest.sh
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run=$here/run.sh
passed=0 failed=0

expect() {
  local name=$1 want=$2 rc=0 out
  shift 2
  out=$("$@" 2>&1) || rc=$?
  if [[ $rc == "$want" ]]; then
    passed=$((passed + 1))
    printf 'PASS  %-50s (status %s)\n' "$name" "$rc"
  else
    failed=$((failed + 1))
    printf 'FAIL  %-50s (status %s, expected %s)\n' "$name" "$rc" "$want"
    printf '%s\n' "$out" | tail -n 20 | sed 's/^/      | /'
  fi
  LAST_OUT=$out
}

# A qemu of ours left behind would be orphaned (parent 1); other people's runs keep
# their run.sh as parent.
orphan_qemus() {
  local p
  for p in $(pgrep -f '^qemu-system-x86_64 -name rsock-rdma-vm' || true); do
    [[ $(ps -o ppid= -p "$p" | tr -d ' ') == 1 ]] && echo "$p"
  done
}

expect "usage error" 2 "$run"

# lib.sh's helpers, inside the guest.
expect "lib.sh helpers (lib-selftest.sh in the guest)" 0 "$run" -- "$here/lib-selftest.sh"

# One boot: exit status, stdout/stderr separation, environment, working directory.
export RSOCK_SELFTEST_VALUE='a b$c'
expect "command status is returned (exit 3)" 3 "$run" -e EXTRA=x=y -- bash -c '
  echo "out:$RSOCK_SELFTEST_VALUE:$EXTRA:$RDMA_VM:$(pwd)"; echo err >&2; exit 3'
if grep -Fqx "out:a b\$c:x=y:1:$(cd "$here/../.." && pwd)" <<<"$LAST_OUT"; then
  passed=$((passed + 1)); echo "PASS  RSOCK_* and --env NAME=VALUE reach the guest"
else
  failed=$((failed + 1)); echo "FAIL  RSOCK_* and --env NAME=VALUE reach the guest"
  printf '%s\n' "$LAST_OUT" | sed 's/^/      | /'
fi
unset RSOCK_SELFTEST_VALUE
stdout_only=$("$run" -- bash -c 'echo to-stdout; echo to-stderr >&2' 2>/dev/null)
if [[ $stdout_only == to-stdout ]]; then
  passed=$((passed + 1)); echo "PASS  stdout and stderr are kept apart"
else
  failed=$((failed + 1)); echo "FAIL  stdout and stderr are kept apart: got '$stdout_only'"
fi

expect "overall timeout -> 98" 98 "$run" --timeout 45 -- sleep 600
expect "broken rxe bring-up -> 97 (bed failure)" 97 env RSOCK_VM_BREAK_DEVICE=1 "$run" -- true
grep -q 'TEST BED FAILURE' <<<"$LAST_OUT" && grep -q 'kept in' <<<"$LAST_OUT" &&
  { passed=$((passed + 1)); echo "PASS  bed failure is reported with the log path"; } ||
  { failed=$((failed + 1)); echo "FAIL  bed failure is reported with the log path"; }
expect "boot timeout -> 97 (bed failure)" 97 "$run" --boot-timeout 2 -- true

# Killed with SIGKILL: qemu must die too (pdeathsig), not linger.
# (its own TMPDIR, to remove the run directory it cannot clean up itself)
victim_tmp=$(mktemp -d)
TMPDIR=$victim_tmp "$run" -- sleep 600 >/dev/null 2>&1 &
victim=$!
sleep 5
kill -KILL "$victim"
wait "$victim" 2>/dev/null
sleep 2
rm -rf "$victim_tmp"
if [[ -z $(orphan_qemus) ]]; then
  passed=$((passed + 1)); echo "PASS  no qemu left running (also after SIGKILL of run.sh)"
else
  failed=$((failed + 1)); echo "FAIL  no qemu left running: $(orphan_qemus)"
fi
echo "$passed passed, $failed failed"
((failed == 0))
