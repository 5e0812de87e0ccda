#!/usr/bin/env bash
# Interactive root shell in the test-bed guest (same bed as run.sh: rxe0 up, project
# directory mounted read-write, namespace plain). 'exit' powers the guest off; the
# shell's exit status is returned. Options are run.sh's (e.g. --topology, --mem, -e).
#
#   tests/rdma-vm/shell.sh [run.sh options]
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --shell "$@"
