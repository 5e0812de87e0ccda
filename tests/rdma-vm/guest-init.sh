#!/bin/bash
# PID 1 of the test-bed guest, second stage: runs with the host's own bash on the
# overlay root that initramfs-init built. Never run this on the host.
#
# It finishes the system (devpts, /dev/shm, memlock limit, kernel modules for modprobe),
# brings up the network and the Soft-RoCE device for the selected topology, runs the
# workload from the control directory, then powers the guest off.
#
# Protocol with run.sh, all files in the control directory $CTL:
#   config      (host -> guest) RDMA_VM_* settings, sourced
#   env.sh      (host -> guest) exported environment for the workload
#   cmd.sh      (host -> guest) the workload: cd to its directory, exec the command
#   ready       (guest) written when the bed is up, just before the workload starts
#   bed_error   (guest) one line: why the bed could not be brought up
#   timeout     (guest) the workload was killed at the guest-side deadline
#   status      (guest) the workload's exit status, written last
#   dmesg.txt   (guest) the kernel log at the end
# Progress messages go to the serial console (kept by run.sh as console.log).
set -uo pipefail

CTL=/run/rdma-vm/ctl
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
exec </dev/null >/dev/ttyS0 2>&1

say() { printf 'rdma-vm-guest: [%6.2fs] %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*"; }

poweroff_now() {
  sync
  # No init system to ask: power off directly (the host's busybox, see setup.sh).
  busybox poweroff -f
  sleep 1000
}

bed_fail() {
  say "TEST BED FAILURE: $*"
  printf '%s\n' "$*" >"$CTL/bed_error"
  dmesg >"$CTL/dmesg.txt" 2>&1
  poweroff_now
}

# shellcheck source=/dev/null
source "$CTL/config" || bed_fail "cannot read $CTL/config"
: "${RDMA_VM_TOPOLOGY:=plain}" "${RDMA_VM_MTU:=1500}" "${RDMA_VM_MODE:=run}"
: "${RDMA_VM_DEADLINE:=0}" "${RDMA_VM_NODE:=0}"

# --- system ---------------------------------------------------------------------
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts || bed_fail "mount devpts"
mount -t tmpfs -o mode=1777 shm /dev/shm || bed_fail "mount /dev/shm"
ln -sfn /proc/self/fd /dev/fd; ln -sfn fd/0 /dev/stdin; ln -sfn fd/1 /dev/stdout; ln -sfn fd/2 /dev/stderr
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
hostname "rdma-vm${RDMA_VM_NODE}"
ulimit -l unlimited || bed_fail "cannot set RLIMIT_MEMLOCK unlimited"
ulimit -n 65536 2>/dev/null || true
# The unpacked kernel's modules, so that modprobe works for anything not preloaded.
if [[ -n ${RDMA_VM_MODDIR:-} && -d $RDMA_VM_MODDIR ]]; then
  mkdir -p "/lib/modules/$(uname -r)" && mount --bind "$RDMA_VM_MODDIR" "/lib/modules/$(uname -r)" ||
    say "warning: cannot bind the module directory"
fi
say "root ready ($(uname -r), $(nproc) CPUs, $(free -m | awk '/^Mem:/ { print $2 }') MiB)"

# --- network + Soft-RoCE ----------------------------------------------------------
# Wait until rxe0's port 1 is ACTIVE and user space (libibverbs' rxe provider) sees it.
wait_rxe_active() {
  local i
  for ((i = 0; i < 300; i++)); do
    if grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null &&
      ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

ip link set lo up || bed_fail "ip link set lo up"
case "$RDMA_VM_TOPOLOGY" in
  local | plain)
    # veth0 (10.77.0.1/24) carries rxe0. Its peer veth1 stays unaddressed in the
    # initial namespace (local), or becomes 10.77.0.2/24 in namespace "plain" (plain):
    # TCP reaches 10.77.0.1 from there, RDMA does not (rxe only serves the initial
    # namespace), which stands in for a host without RDMA.
    ip link add veth0 mtu "$RDMA_VM_MTU" type veth peer name veth1 mtu "$RDMA_VM_MTU" ||
      bed_fail "cannot create the veth pair"
    ip addr add 10.77.0.1/24 dev veth0 || bed_fail "ip addr add 10.77.0.1/24 dev veth0"
    if [[ $RDMA_VM_TOPOLOGY == plain ]]; then
      ip netns add plain || bed_fail "ip netns add plain"
      ip link set veth1 netns plain || bed_fail "cannot move veth1 into namespace plain"
      ip -n plain addr add 10.77.0.2/24 dev veth1 || bed_fail "addr 10.77.0.2 in namespace plain"
      ip -n plain link set lo up && ip -n plain link set veth1 up || bed_fail "links up in namespace plain"
    else
      ip link set veth1 up || bed_fail "ip link set veth1 up"
    fi
    ip link set veth0 up || bed_fail "ip link set veth0 up"
    rxe_netdev=veth0
    ;;
  pair)
    # Two guests, one virtio-net NIC each, joined by a qemu socket netdev: node 0 is
    # 10.77.1.1, node 1 is 10.77.1.2; each has its own rxe0 on its eth NIC.
    nic=
    for d in /sys/class/net/*; do
      [[ -e $d/device ]] && { nic=${d##*/}; break; }
    done
    [[ -n $nic ]] || bed_fail "no NIC for the pair topology ($(ls /sys/class/net | tr '\n' ' '))"
    ip link set "$nic" name eth0 2>/dev/null && nic=eth0
    ip link set "$nic" mtu "$RDMA_VM_MTU" || bed_fail "ip link set $nic mtu $RDMA_VM_MTU"
    ip addr add "10.77.1.$((RDMA_VM_NODE + 1))/24" dev "$nic" || bed_fail "ip addr on $nic"
    ip link set "$nic" up || bed_fail "ip link set $nic up"
    # A directory both nodes see (no caching), for lib.sh's pair_signal / pair_wait.
    mkdir -p /run/rdma-vm/pair
    mount -t 9p -o trans=virtio,version=9p2000.L,cache=none pairshare /run/rdma-vm/pair ||
      bed_fail "cannot mount the pair share"
    rxe_netdev=$nic
    ;;
  *) bed_fail "unknown topology '$RDMA_VM_TOPOLOGY'" ;;
esac

if [[ -n ${RDMA_VM_BREAK_DEVICE:-} ]]; then
  # Test hook for run.sh's own tests: bring up rxe on a device that does not exist.
  rxe_netdev=no-such-netdev
fi
err=$(rdma link add rxe0 type rxe netdev "$rxe_netdev" 2>&1) ||
  bed_fail "rdma link add rxe0 type rxe netdev $rxe_netdev failed: $err"
wait_rxe_active || bed_fail "rxe0 port 1 did not become PORT_ACTIVE within 30 s"
say "rxe0 on $rxe_netdev: PORT_ACTIVE, $(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null)"

if [[ $RDMA_VM_TOPOLOGY == pair ]]; then
  # Wait for the peer guest to answer on the wire (it boots in parallel).
  peer=10.77.1.$((2 - RDMA_VM_NODE))
  # (busybox's ping: iputils-ping is not among the bed's packages)
  until busybox ping -c1 -W1 "$peer" >/dev/null 2>&1; do
    ((SECONDS < 180)) || bed_fail "peer $peer does not answer ping"
    sleep 0.5
  done
  say "peer $peer reachable"
fi

# --- workload ---------------------------------------------------------------------
date +%s >"$CTL/ready"
set -a
# shellcheck source=/dev/null
source "$CTL/env.sh" || bed_fail "cannot read $CTL/env.sh"
set +a

if [[ $RDMA_VM_MODE == shell ]]; then
  say "interactive shell on hvc0"
  rc=0
  setsid -c -w bash -c 'stty rows "${RDMA_VM_ROWS:-24}" cols "${RDMA_VM_COLS:-80}" 2>/dev/null
    cd "$RDMA_VM_WORKDIR"; PS1="[rdma-vm \W]# " exec bash --norc -i' \
    </dev/hvc0 >/dev/hvc0 2>&1 || rc=$?
else
  say "running the workload"
  # hvc0/hvc1 are ttys: make them pass bytes through untouched (no \n -> \r\n). hvc
  # resets a tty's settings when its last file is closed, so keep them open.
  exec 3<>/dev/hvc0 4<>/dev/hvc1
  stty raw -echo <&3 && stty raw -echo <&4 || bed_fail "stty raw on hvc0/hvc1"
  # In its own session (so a timeout kills the whole process group); stdout to hvc0,
  # stderr to hvc1, which run.sh copies to its own stdout and stderr.
  setsid bash "$CTL/cmd.sh" </dev/null >&3 2>&4 3>&- 4>&- &
  pid=$!
  remaining=$((RDMA_VM_DEADLINE - $(date +%s)))
  if ((RDMA_VM_DEADLINE > 0)); then
    # Guest-side deadline (before run.sh's own): kill the workload, then still report.
    (
      sleep "$((remaining > 1 ? remaining : 1))"
      say "deadline reached: killing the workload"
      touch "$CTL/timeout"
      ps --ppid 2 -p 2 --deselect -o pid,pgid,stat,etime,args >"$CTL/ps.txt" 2>&1
      kill -TERM -- "-$pid" 2>/dev/null
      sleep 10
      kill -KILL -- "-$pid" 2>/dev/null
    ) &
    watchdog=$!
  fi
  rc=0
  wait "$pid" || rc=$?
  [[ -n ${watchdog:-} ]] && kill "$watchdog" 2>/dev/null
  # Reap anything the workload left behind in its session.
  kill -KILL -- "-$pid" 2>/dev/null
fi
say "workload exited with status $rc"

dmesg >"$CTL/dmesg.txt" 2>&1
printf '%s\n' "$rc" >"$CTL/status"
poweroff_now
