# Preamble of every cell-based RDMA suite (tests/rdma/*.sh): from the project root, with
# the test bed's helpers, the cell runner and the RDMA cell checks loaded; inside the
# Soft-RoCE guest only. Source it first thing:
#   . "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
# shellcheck source=common.sh
. tests/lib/common.sh
# shellcheck source=rdma_cells.sh
. tests/lib/rdma_cells.sh
rdma_vm_require_guest
t_init
