# shellcheck shell=bash disable=SC2034
# Host-side definitions shared by setup.sh, run.sh, shell.sh (sourced, not run).
#
# Everything the test bed builds lives in one cache directory, outside git:
#   $RSOCK_VM_CACHE (default <repo>/.cache/rdma-vm, ignored by .gitignore)
#     debs/                    downloaded kernel packages
#     kernel/<kver>/           the kernel package unpacked with dpkg -x (+ depmod)
#     initramfs-<kver>.cpio.gz the guest's first stage (busybox + modules + init)
#     initramfs-<kver>.stamp   what that initramfs was built from
#     current                  kernel version selected by the last setup.sh
#     logs/                    logs kept from failed runs

RDMA_VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RSOCK_REPO=$(cd "$RDMA_VM_DIR/../.." && pwd)
RSOCK_VM_CACHE=${RSOCK_VM_CACHE:-$RSOCK_REPO/.cache/rdma-vm}
[[ $RSOCK_VM_CACHE == /* ]] || RSOCK_VM_CACHE=$PWD/$RSOCK_VM_CACHE

# Exit codes of run.sh besides the command's own status (documented in README.md).
RDMA_VM_EXIT_USAGE=2
RDMA_VM_EXIT_BED=97      # the test bed failed: host setup, boot, mounts, rxe bring-up
RDMA_VM_EXIT_TIMEOUT=98  # the overall timeout expired; qemu was killed

# Host packages the bed needs (Debian 12 names). qemu + busybox + cpio + kmod build
# and boot the guest; the rest are the RDMA user space and test programs that the
# guest runs straight from the host's root filesystem.
RDMA_VM_PACKAGES=(
  qemu-system-x86 busybox-static cpio kmod xz-utils iproute2 procps
  rdma-core ibverbs-providers libibverbs1 librdmacm1 rdmacm-utils ibverbs-utils
  perftest iperf3 iperf netcat-openbsd socat curl
)

# Modules PID 1 loads from the initramfs (dependencies are resolved by setup.sh).
# virtio_* + 9p* + overlay get the root filesystem; the rest is the RDMA stack and
# what rxe needs. virtio_net is for the two-guest topology.
RDMA_VM_MODULES=(
  virtio_pci virtio_console virtio_net 9pnet_virtio 9p netfs fscache overlay veth
  crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe configfs
  ib_cm iw_cm rdma_cm rdma_ucm ib_umad
)

rdma_vm_log() { printf 'rdma-vm: %s\n' "$*" >&2; }
rdma_vm_die() { printf 'rdma-vm: error: %s\n' "$*" >&2; exit "${2:-1}"; }

# Print the kernel version selected by setup.sh (or RSOCK_VM_KERNEL), or fail.
rdma_vm_kver() {
  if [[ -n ${RSOCK_VM_KERNEL:-} ]]; then
    printf '%s\n' "$RSOCK_VM_KERNEL"
  elif [[ -s $RSOCK_VM_CACHE/current ]]; then
    cat "$RSOCK_VM_CACHE/current"
  else
    return 1
  fi
}
