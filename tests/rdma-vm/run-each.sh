#!/usr/bin/env bash
# Run several test scripts in ONE boot of the guest, one after the other. Runs inside
# the guest:
#
#   tests/rdma-vm/run.sh -- tests/rdma-vm/run-each.sh SCRIPT [SCRIPT...]
#
# Each script runs from the project directory with its own output; a banner opens it
# and a PASS/FAIL line closes it (status, seconds). Every script runs even if an
# earlier one failed. RDMA_VM_EACH_TIMEOUT (seconds, default 600) bounds each script.
# The closing line is "N passed, N failed" (scripts); the exit status is 1 if any
# script failed, else 0.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
(($#)) || { echo "usage: $0 SCRIPT [SCRIPT...]" >&2; exit 2; }
limit=${RDMA_VM_EACH_TIMEOUT:-600}
passed=0 failed=0 failures=()

for script in "$@"; do
  printf '\n===== %s\n' "$script"
  t0=$SECONDS rc=0
  if [[ -x $script ]]; then
    [[ $script == */* ]] || script=./$script
    timeout -k 10 "$limit" "$script" </dev/null || rc=$?
  else
    timeout -k 10 "$limit" bash "$script" </dev/null || rc=$?
  fi
  if ((rc == 0)); then
    passed=$((passed + 1))
    printf '===== PASS  %s (%ds)\n' "$script" $((SECONDS - t0))
  else
    failed=$((failed + 1))
    failures+=("$script")
    printf '===== FAIL  %s (status %d%s, %ds)\n' "$script" "$rc" \
      "$( ((rc == 124)) && echo ", killed after ${limit}s")" $((SECONDS - t0))
  fi
done

printf '\n'
((failed == 0)) || printf 'failed: %s\n' "${failures[*]}"
echo "$passed passed, $failed failed"
((failed == 0))
