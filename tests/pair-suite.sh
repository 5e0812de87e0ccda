#!/usr/bin/env bash
# Runs on both guests of the two-host test bed (tests/rdma-vm/run.sh --topology pair --
# tests/pair-suite.sh): every tests/rdma-pair/*.sh in turn, each syncing its two nodes.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
passed=0 failed=0
# dead_peer.sh takes a link down for good: it runs last.
for t in $(ls tests/rdma-pair/*.sh | grep -v /dead_peer.sh) tests/rdma-pair/dead_peer.sh; do
  [[ -e $t ]] || continue
  echo "--- $t"
  if "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "--- $t FAILED"; fi
done
echo "pair suites: $passed passed, $failed failed"
((failed == 0))
