#!/usr/bin/env bash
# Boot the Soft-RoCE test-bed guest and run one command in it.
#
#   tests/rdma-vm/run.sh [options] -- CMD [ARGS...]
#   tests/rdma-vm/run.sh [options] --shell
#
# The guest (qemu TCG, Debian's kernel, rdma_rxe) sees the host's / read-only under a
# tmpfs overlay and this project directory read-write at the same path, so CMD runs
# the host's own binaries (target/release/...). CMD runs as root in the project
# directory (or the current directory when it is inside the project), after rxe0 is
# PORT_ACTIVE; its stdout and stderr are streamed to ours. Run many tests in one boot
# by giving a script as CMD.
#
# Options (environment variable in brackets; --option=value works too):
#   -t, --timeout SECS       overall limit, boot included [RSOCK_VM_TIMEOUT, 1200]
#       --boot-timeout SECS  limit for the bed to come up [RSOCK_VM_BOOT_TIMEOUT, 300]
#   -m, --mem MIB            guest memory [RSOCK_VM_MEM, 2048]
#       --smp N              guest vCPUs [RSOCK_VM_SMP, 2]
#       --topology NAME      local | plain | pair [RSOCK_VM_TOPOLOGY, plain] (README.md)
#       --mtu N              MTU of the link under rxe0 [RSOCK_VM_MTU, 1500]
#   -e, --env NAME[=VALUE]   pass a variable into the guest (repeatable) [RSOCK_VM_ENV,
#                            space-separated names]; RSOCK_*, RUST_LOG, RUST_BACKTRACE
#                            and CI are always passed
#   -v, --verbose            show the guest's serial console (kernel, bed) on stderr
#       --log-dir DIR        where logs of failed runs are kept [RSOCK_VM_LOG_DIR,
#                            $RSOCK_VM_CACHE/logs]
#       --keep-logs          keep the logs of successful runs too
#       --shell              an interactive shell in the guest instead of CMD
#
# Exit status: CMD's own status; 97 = TEST BED failure (setup, qemu, boot, mounts, rxe
# bring-up); 98 = timeout (qemu killed); 2 = usage error.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

timeout_s=${RSOCK_VM_TIMEOUT:-1200}
boot_timeout_s=${RSOCK_VM_BOOT_TIMEOUT:-300}
mem=${RSOCK_VM_MEM:-2048}
smp=${RSOCK_VM_SMP:-2}
topology=${RSOCK_VM_TOPOLOGY:-plain}
mtu=${RSOCK_VM_MTU:-1500}
log_dir=${RSOCK_VM_LOG_DIR:-$RSOCK_VM_CACHE/logs}
verbose=0 keep_logs=0 mode=run
env_names=(RUST_LOG RUST_BACKTRACE CI)
read -r -a extra <<<"${RSOCK_VM_ENV:-}"
env_names+=("${extra[@]}")
env_sets=()

bad_usage() { echo "run.sh: $*" >&2; echo "try: $0 --help" >&2; exit "$RDMA_VM_EXIT_USAGE"; }
while (($#)); do
  # --option=value is the same as --option value.
  if [[ $1 == --?*=* ]]; then
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
  fi
  case "$1" in
    -t | --timeout) timeout_s=${2:?}; shift 2 ;;
    --boot-timeout) boot_timeout_s=${2:?}; shift 2 ;;
    -m | --mem) mem=${2:?}; shift 2 ;;
    --smp) smp=${2:?}; shift 2 ;;
    --topology) topology=${2:?}; shift 2 ;;
    --mtu) mtu=${2:?}; shift 2 ;;
    -e | --env)
      [[ ${2:-} == *=* ]] && env_sets+=("$2") || env_names+=("${2:?}")
      shift 2 ;;
    -v | --verbose) verbose=1; shift ;;
    --log-dir) log_dir=${2:?}; shift 2 ;;
    --keep-logs) keep_logs=1; shift ;;
    --shell) mode=shell; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) bad_usage "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $mode == shell ]] || (($#)) || bad_usage "no command given (use -- CMD [ARGS...] or --shell)"
[[ $mode == run ]] || (($# == 0)) || bad_usage "--shell takes no command"
for n in "$timeout_s" "$boot_timeout_s" "$mem" "$smp" "$mtu"; do
  [[ $n =~ ^[0-9]+$ ]] || bad_usage "not a number: $n"
done
case "$topology" in
  local | plain) nodes=1 ;;
  pair) nodes=2 ;;
  *) bad_usage "unknown topology '$topology' (local, plain or pair)" ;;
esac
[[ $mode == shell && $nodes != 1 ]] && bad_usage "--shell works with one guest only"

bed_failure() {
  printf 'rdma-vm: TEST BED FAILURE: %s\n' "$*" >&2
}

# --- host side checks ---------------------------------------------------------------
if ! "$RDMA_VM_DIR/setup.sh" --check; then
  rdma_vm_log "the bed is not set up (or setup inputs changed): running setup.sh"
  "$RDMA_VM_DIR/setup.sh" >&2 || { bed_failure "setup.sh failed"; exit "$RDMA_VM_EXIT_BED"; }
fi
kver=$(rdma_vm_kver)
kdir=$RSOCK_VM_CACHE/kernel/$kver
kernel=$kdir/boot/vmlinuz-$kver
initrd=$RSOCK_VM_CACHE/initramfs-$kver.cpio.gz

workdir=$PWD
[[ $workdir == "$RSOCK_REPO" || $workdir == "$RSOCK_REPO"/* ]] || workdir=$RSOCK_REPO

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/rdma-vm.XXXXXX")
qemu_pids=() reader_pids=()

# Kill whatever is still running (qemu, output readers) and remove the run directory.
cleanup() {
  local p i
  for p in "${qemu_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for i in 1 2 3 4 5 6 7 8 9 10; do
    p=
    for p in "${qemu_pids[@]}"; do kill -0 "$p" 2>/dev/null && break; p=; done
    [[ -z $p ]] && break
    sleep 0.5
  done
  for p in "${qemu_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${reader_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT
trap 'rdma_vm_log "interrupted"; exit 130' INT
trap 'rdma_vm_log "terminated"; exit 143' TERM

# --- per-node control directory ---------------------------------------------------------
deadline=$(($(date +%s) + timeout_s - 30))
((timeout_s > 60)) || deadline=0

write_env() {
  local name
  # RSOCK_* (but not the bed's own RSOCK_VM_*), the default names, --env and RSOCK_VM_ENV.
  while IFS= read -r name; do
    [[ $name == RSOCK_VM_* ]] || printf 'export %s=%q\n' "$name" "${!name}"
  done < <(compgen -e | grep '^RSOCK_' || true)
  for name in "${env_names[@]}"; do
    [[ -n $name && -v $name ]] && printf 'export %s=%q\n' "$name" "${!name}"
  done
  for name in "${env_sets[@]}"; do
    printf 'export %s=%q\n' "${name%%=*}" "${name#*=}"
  done
  printf 'export TERM=%q\n' "${TERM:-dumb}"
  printf 'export RDMA_VM=1 RDMA_VM_TOPOLOGY=%q\n' "$topology"
}

((nodes == 1)) || mkdir -p "$run_dir/pair"
for ((i = 0; i < nodes; i++)); do
  ctl=$run_dir/node$i/ctl
  mkdir -p "$ctl" "$run_dir/node$i/fifo"
  {
    printf 'RDMA_VM_PROJECT=%q\n' "$RSOCK_REPO"
    printf 'RDMA_VM_STAGE2=%q\n' "$RDMA_VM_DIR/guest-init.sh"
    printf 'RDMA_VM_MODDIR=%q\n' "$kdir/lib/modules/$kver"
    printf 'RDMA_VM_TOPOLOGY=%q\n' "$topology"
    printf 'RDMA_VM_MTU=%q\n' "$mtu"
    printf 'RDMA_VM_MODE=%q\n' "$mode"
    printf 'RDMA_VM_NODE=%q\n' "$i"
    printf 'RDMA_VM_DEADLINE=%q\n' "$deadline"
    printf 'RDMA_VM_WORKDIR=%q\n' "$workdir"
    [[ -n ${RSOCK_VM_BREAK_DEVICE:-} ]] && printf 'RDMA_VM_BREAK_DEVICE=1\n'
    if [[ $mode == shell ]] && stty size >/dev/null 2>&1; then
      read -r rows cols < <(stty size)
      printf 'RDMA_VM_ROWS=%q\nRDMA_VM_COLS=%q\n' "$rows" "$cols"
    fi
  } >"$ctl/config"
  {
    write_env
    printf 'export RDMA_VM_NODE=%q\n' "$i"
    if ((nodes == 2)); then
      printf 'export RDMA_VM_SELF=10.77.1.%d RDMA_VM_PEER=10.77.1.%d\n' $((i + 1)) $((2 - i))
    fi
    printf 'export RDMA_VM_WORKDIR=%q\n' "$workdir"
  } >"$ctl/env.sh"
  if [[ $mode == run ]]; then
    {
      printf 'cd %q || exit 97\n' "$workdir"
      printf 'exec'
      printf ' %q' "$@"
      printf '\n'
    } >"$ctl/cmd.sh"
  fi
done

# --- qemu ---------------------------------------------------------------------------------
# A path inside a qemu option value: commas must be doubled.
q() { printf '%s' "${1//,/,,}"; }

qemu_args() {
  local i=$1 ctl fifo run repo
  ctl=$(q "$run_dir/node$i/ctl") fifo=$(q "$run_dir/node$i/fifo") run=$(q "$run_dir")
  repo=$(q "$RSOCK_REPO")
  local p9='security_model=none,multidevs=remap'
  # Kernel: console on ttyS0 (kept as console.log), warnings included (loglevel=5);
  # panic=-1 + -no-reboot turn a panic into a qemu exit; mitigations=off because this
  # throwaway guest gains nothing from them and TCG pays for every barrier.
  printf '%s\n' \
    -name "rsock-rdma-vm$i" -nodefaults -no-user-config -display none -no-reboot \
    -machine q35 -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem" \
    -kernel "$(q "$kernel")" -initrd "$(q "$initrd")" \
    -append "console=ttyS0 panic=-1 loglevel=5 mitigations=off rdma_vm=1" \
    -chardev "file,id=con,path=$ctl/console.log" -serial chardev:con \
    -device virtio-rng-pci \
    -device virtio-serial-pci \
    -virtfs "local,path=/,mount_tag=hostroot,readonly=on,$p9" \
    -virtfs "local,path=$repo,mount_tag=project,$p9" \
    -virtfs "local,path=$ctl,mount_tag=ctl,$p9" \
    -pidfile "$run_dir/node$i/qemu.pid"
  if [[ $mode == shell ]]; then
    printf '%s\n' -chardev stdio,id=out,signal=off -device virtconsole,chardev=out
  else
    printf '%s\n' -chardev "pipe,id=out,path=$fifo/out" -device virtconsole,chardev=out \
      -chardev "pipe,id=err,path=$fifo/err" -device virtconsole,chardev=err
  fi
  if ((nodes == 2)); then
    # The two guests share a directory to signal each other (lib.sh pair_signal), and
    # their NICs are joined by a pair of Unix datagram sockets on this host.
    printf '%s\n' -virtfs "local,path=$run/pair,mount_tag=pairshare,security_model=none"
    printf '%s\n' -netdev "dgram,id=wire,local.type=unix,local.path=$run/wire$i.sock,remote.type=unix,remote.path=$run/wire$((1 - i)).sock" \
      -device "virtio-net-pci,netdev=wire,mac=52:54:00:77:01:0$((i + 1))"
  fi
}

start=$(date +%s.%N)
elapsed() { awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }

if [[ $mode == shell ]]; then
  rdma_vm_log "booting kernel $kver (TCG, $smp vCPU, $mem MiB, topology $topology); 'exit' powers off"
  mapfile -t args < <(qemu_args 0)
  rc=0
  setpriv --pdeathsig KILL -- qemu-system-x86_64 "${args[@]}" || rc=$?
  ctl=$run_dir/node0/ctl
  if [[ -e $ctl/bed_error ]]; then
    bed_failure "$(cat "$ctl/bed_error")"; exit "$RDMA_VM_EXIT_BED"
  fi
  [[ -e $ctl/status ]] || { bed_failure "qemu exited ($rc) without a shell status"; exit "$RDMA_VM_EXIT_BED"; }
  exit "$(cat "$ctl/status")"
fi

rdma_vm_log "booting kernel $kver (TCG, $smp vCPU, $mem MiB, topology $topology, timeout ${timeout_s}s)"
for ((i = 0; i < nodes; i++)); do
  fifo=$run_dir/node$i/fifo
  mkfifo "$fifo/out.in" "$fifo/out.out" "$fifo/err.in" "$fifo/err.out"
  # Copy the guest's stdout/stderr to ours (lines of node 1 are prefixed in a pair).
  if ((i == 0)); then
    cat "$fifo/out.out" &
    reader_pids+=($!)
    cat "$fifo/err.out" >&2 &
    reader_pids+=($!)
  else
    sed -u "s/^/[node$i] /" "$fifo/out.out" &
    reader_pids+=($!)
    sed -u "s/^/[node$i] /" "$fifo/err.out" >&2 &
    reader_pids+=($!)
  fi
  if ((verbose)); then
    touch "$run_dir/node$i/ctl/console.log"
    tail -n +1 -f "$run_dir/node$i/ctl/console.log" | sed -u "s/^/[console$i] /" >&2 &
    reader_pids+=($!)
  fi
  mapfile -t args < <(qemu_args "$i")
  # pdeathsig: qemu dies with this script even if it is killed with SIGKILL.
  setpriv --pdeathsig KILL -- qemu-system-x86_64 "${args[@]}" </dev/null \
    >"$run_dir/node$i/qemu.out" 2>&1 &
  qemu_pids+=($!)
done

# Wait for every qemu to exit, enforcing the boot and overall timeouts.
outcome=ok
ready_seen=()
while :; do
  alive=0
  for ((i = 0; i < nodes; i++)); do
    kill -0 "${qemu_pids[i]}" 2>/dev/null && alive=1
    if [[ -z ${ready_seen[i]:-} && -e $run_dir/node$i/ctl/ready ]]; then
      ready_seen[i]=1
      rdma_vm_log "node$i: bed ready after $(elapsed)s, running the command"
    fi
  done
  ((alive)) || break
  # In a pair, one guest's bed failure dooms the run: don't let the other wait for it.
  if ((nodes > 1)) && compgen -G "$run_dir/node*/ctl/bed_error" >/dev/null; then
    outcome=bed
    break
  fi
  now=$(date +%s)
  if ((now - ${start%.*} >= timeout_s)); then
    outcome=timeout
    break
  fi
  if ((now - ${start%.*} >= boot_timeout_s)); then
    for ((i = 0; i < nodes; i++)); do
      if [[ -z ${ready_seen[i]:-} && ! -e $run_dir/node$i/ctl/bed_error ]] &&
        kill -0 "${qemu_pids[i]}" 2>/dev/null; then
        outcome=boot-timeout
      fi
    done
    [[ $outcome == ok ]] || break
  fi
  sleep 0.5
done
if [[ $outcome != ok ]]; then
  for p in "${qemu_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
fi
qemu_rc=()
for ((i = 0; i < nodes; i++)); do
  r=0
  wait "${qemu_pids[i]}" || r=$?
  qemu_rc[i]=$r
done
qemu_pids=()
# The readers see end-of-file once qemu is gone; give them a moment to drain.
for p in "${reader_pids[@]}"; do
  for ((j = 0; j < 20; j++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
done
total=$(elapsed)

# --- verdict --------------------------------------------------------------------------------
rc=0 kind=ok
for ((i = 0; i < nodes; i++)); do
  ctl=$run_dir/node$i/ctl
  if [[ $outcome == timeout ]]; then
    kind=timeout
  elif [[ -e $ctl/bed_error ]]; then
    bed_failure "node$i: $(cat "$ctl/bed_error")"
    kind=bed
  elif [[ $outcome == bed ]]; then
    continue  # the failing node reports it
  elif [[ $outcome == boot-timeout && ! -e $ctl/ready ]]; then
    bed_failure "node$i: the bed was not up within ${boot_timeout_s}s (boot or device bring-up hung)"
    kind=bed
  elif [[ -e $ctl/timeout ]]; then
    kind=timeout
  elif [[ ! -e $ctl/status ]]; then
    if ((qemu_rc[i] != 0)); then
      bed_failure "node$i: qemu failed (status ${qemu_rc[i]}): $(tail -n 5 "$run_dir/node$i/qemu.out")"
    else
      bed_failure "node$i: the guest stopped without reporting a status (kernel panic? see the console log)"
    fi
    kind=bed
  else
    r=$(cat "$ctl/status")
    ((rc != 0)) || rc=$r
    continue
  fi
  break
done
if [[ $kind == bed ]]; then
  # The end of the serial console usually says what went wrong.
  for ((i = 0; i < nodes; i++)); do
    if [[ -s $run_dir/node$i/ctl/console.log ]]; then
      rdma_vm_log "node$i: last lines of the guest console:"
      tail -n 15 "$run_dir/node$i/ctl/console.log" | sed 's/^/  | /' >&2
    fi
  done
fi
case "$kind" in
  timeout)
    if [[ $outcome == timeout ]]; then
      printf 'rdma-vm: TIMEOUT: the run did not finish within %ss; qemu killed\n' "$timeout_s" >&2
    else
      printf 'rdma-vm: TIMEOUT: the command did not finish within %ss (killed at the guest deadline, %ss before the overall timeout)\n' \
        "$((timeout_s - 30))" 30 >&2
    fi
    rc=$RDMA_VM_EXIT_TIMEOUT ;;
  bed) rc=$RDMA_VM_EXIT_BED ;;
esac

# Kernel warnings (rxe can WARN when a stuck RDMA program is killed) are always reported.
warned=0
for ((i = 0; i < nodes; i++)); do
  for f in "$run_dir/node$i/ctl/dmesg.txt" "$run_dir/node$i/ctl/console.log"; do
    if [[ -s $f ]] && grep -qE 'WARNING:|BUG:|Oops|Call Trace|general protection' "$f"; then
      rdma_vm_log "node$i: the guest kernel logged warnings:"
      grep -E 'WARNING:|BUG:|Oops|general protection' "$f" | head -n 10 | sed 's/^/  /' >&2
      warned=1
      break
    fi
  done
done

if ((rc != 0 || warned || keep_logs)); then
  mkdir -p "$log_dir"
  keep=$log_dir/run-$(date -u +%Y%m%dT%H%M%SZ)-$$
  mkdir -p "$keep"
  for ((i = 0; i < nodes; i++)); do
    for f in console.log dmesg.txt ps.txt bed_error status; do
      [[ -e $run_dir/node$i/ctl/$f ]] && cp "$run_dir/node$i/ctl/$f" "$keep/node$i-$f"
    done
    cp "$run_dir/node$i/qemu.out" "$keep/node$i-qemu.out" 2>/dev/null || true
  done
  rdma_vm_log "guest logs (kernel log, console) kept in $keep"
  # Keep the 30 newest.
  ls -dt "$log_dir"/run-* 2>/dev/null | tail -n +31 | while read -r old; do rm -rf "$old"; done
fi
rdma_vm_log "done in ${total}s, exit status $rc"
exit "$rc"
