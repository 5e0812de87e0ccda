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
echo "guest suites: $passed passed, $failed failed"
((failed == 0))
