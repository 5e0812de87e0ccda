#!/usr/bin/env bash
# Runs inside the Soft-RoCE guest (tests/rdma-vm/run.sh -- tests/guest-suite.sh): first
# the test bed's own smoke test, then every RDMA suite, in one boot. A failing smoke test
# stops here: it is the bed that is broken, not the product.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tests/rdma-vm/smoke.sh || { echo "TEST BED BROKEN: smoke test failed; product suites not run"; exit 97; }

passed=0 failed=0
for t in tests/rdma/*.sh; do
  [[ -e $t ]] || continue
  echo "--- $t"
  if "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "--- $t FAILED"; fi
done
# The benchmark's smoke run: seconds per measurement, no speed assertions, but it fails if a
# measurement cannot run or if rsock's figures did not go over RDMA (keeps the bench alive).
echo "--- bench/rdma/guest.sh --smoke"
if bench/rdma/guest.sh --smoke --out /tmp/rsock-bench-smoke; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "--- bench smoke FAILED"; fi

echo "guest suites: $passed passed, $failed failed"
((failed == 0))
