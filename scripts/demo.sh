#!/usr/bin/env bash
# The main job: build the shim and push a real transfer through it, then show which path
# the bytes took (the shim's own counters, and the RDMA device's packet counters).
#
#   scripts/demo.sh [MiB]     (default 64)
#
# With an RDMA device on this host the transfer runs here; otherwise it runs inside the
# Soft-RoCE test bed (a qemu guest with rdma_rxe), set up on first use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mib=${1:-64}

scripts/setup.sh
if [[ -n $(ls -A /sys/class/infiniband 2>/dev/null) ]]; then
  exec scripts/demo-transfer.sh "$mib" "${RSOCK_DEMO_ADDR:-127.0.0.1}"
fi
echo "demo: no RDMA device on this host; running the transfer in the Soft-RoCE test bed" >&2
tests/rdma-vm/setup.sh
exec tests/rdma-vm/run.sh -- scripts/demo-transfer.sh "$mib" 10.77.0.1
