#!/usr/bin/env bash
# Run a command in network namespace "plain" of the test-bed guest: the stand-in for a
# host without RDMA (topology plain, the default). Runs inside the guest only.
#
#   tests/rdma-vm/in-plain.sh [--rdma-dev] CMD [ARGS...]
#
# There the only interface is veth1, 10.77.0.2/24, so TCP to 10.77.0.1 (veth0 in the
# initial namespace) works, while RDMA to it cannot (rxe0 serves the initial namespace
# only). By default /dev/infiniband is also hidden (an empty tmpfs over it, in a private
# mount namespace), as on a host without RDMA drivers: rdma_create_event_channel fails
# with ENODEV and ibv_get_device_list finds no device.
# --rdma-dev keeps /dev/infiniband: then the devices are listed, as on a host whose
# RDMA NIC cannot reach the peer: rdma_resolve_addr fails (RDMA_CM_EVENT_ADDR_ERROR,
# -19, in about 0.35 s).
set -euo pipefail

keep_dev=0
if [[ ${1:-} == --rdma-dev ]]; then
  keep_dev=1
  shift
fi
(($#)) || { echo "usage: $0 [--rdma-dev] CMD [ARGS...]" >&2; exit 2; }
if ! ip netns list 2>/dev/null | grep -qw '^plain'; then
  echo "in-plain.sh: no namespace 'plain' (run in the guest with --topology plain)" >&2
  exit 2
fi

if ((keep_dev)); then
  exec ip netns exec plain "$@"
fi
# ip netns exec already gives the command a private mount namespace (to remount /sys);
# unshare makes sure the tmpfs over /dev/infiniband never leaks to the initial one.
exec ip netns exec plain unshare --mount --propagation private \
  bash -c 'mount -t tmpfs -o ro,mode=0755 rdma-hidden /dev/infiniband && exec "$@"' in-plain "$@"
