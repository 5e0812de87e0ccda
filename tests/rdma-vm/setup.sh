#!/usr/bin/env bash
# Prepare the Soft-RoCE test bed on a Debian 12 host (idempotent; quick when done).
#
#   tests/rdma-vm/setup.sh [--check]
#
#  1. installs the host packages that are missing (apt-get, no recommends);
#  2. resolves Debian's current kernel (linux-image-amd64 -> linux-image-6.1.0-NN-amd64,
#     or RSOCK_VM_KERNEL=6.1.0-NN-amd64), downloads it with apt-get download and
#     unpacks it with dpkg -x into $RSOCK_VM_CACHE/kernel/<kver> (never installed as the
#     host's kernel), then runs depmod there;
#  3. builds the initramfs: static busybox, initramfs-init as /init, and the modules
#     of RDMA_VM_MODULES (common.sh) with their dependencies, decompressed.
# A stamp (kernel version + hashes of the init script, module list and busybox) makes
# a re-run a no-op; editing initramfs-init rebuilds the initramfs.
# --check: change nothing; exit 0 if the bed is ready, 1 if setup.sh must run.
#
# Environment: RSOCK_VM_CACHE (default <repo>/.cache/rdma-vm), RSOCK_VM_KERNEL.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit "$RDMA_VM_EXIT_USAGE" ;;
esac

apt_updated=0
apt_update_once() {
  if (( ! apt_updated )); then
    rdma_vm_log "apt-get update"
    apt-get update -qq
    apt_updated=1
  fi
}

# --- 1. host packages -----------------------------------------------------------
missing_packages() {
  local p
  declare -A ok=()
  while read -r p; do
    ok[$p]=1
  done < <(dpkg-query -W -f='${Package} ${Status}\n' "${RDMA_VM_PACKAGES[@]}" 2>/dev/null |
    awk '$2 == "install" && $3 == "ok" && $4 == "installed" { print $1 }')
  for p in "${RDMA_VM_PACKAGES[@]}"; do
    [[ -n ${ok[$p]:-} ]] || printf '%s\n' "$p"
  done
}

# --- 2. kernel ------------------------------------------------------------------
# Print the versioned kernel (e.g. 6.1.0-56-amd64) linux-image-amd64 depends on.
resolve_kver() {
  local dep
  dep=$(apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -n1)
  if [[ -z $dep ]]; then
    apt_update_once
    dep=$(apt-cache depends linux-image-amd64 |
      sed -n 's/^ *Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -n1)
  fi
  [[ -n $dep ]] || rdma_vm_die "cannot resolve the kernel from 'apt-cache depends linux-image-amd64'"
  printf '%s\n' "$dep"
}

# Unpack linux-image-<kver> into $RSOCK_VM_CACHE/kernel/<kver> (skipped when done).
fetch_kernel() {
  local kver=$1 kdir=$RSOCK_VM_CACHE/kernel/$1 deb
  if [[ -e $kdir/.complete ]]; then
    return 0
  fi
  mkdir -p "$RSOCK_VM_CACHE/debs"
  deb=$(compgen -G "$RSOCK_VM_CACHE/debs/linux-image-${kver}_*_amd64.deb" | head -n1 || true)
  if [[ -z $deb ]]; then
    rdma_vm_log "downloading linux-image-$kver"
    # apt-get download writes to the current directory. As root it warns that its
    # sandbox user cannot write there (harmless): stderr is shown only on a retry.
    if ! (cd "$RSOCK_VM_CACHE/debs" && apt-get download -q "linux-image-$kver" 2>/dev/null); then
      apt_update_once
      (cd "$RSOCK_VM_CACHE/debs" && apt-get download -q "linux-image-$kver")
    fi
    deb=$(compgen -G "$RSOCK_VM_CACHE/debs/linux-image-${kver}_*_amd64.deb" | head -n1 || true)
    [[ -n $deb ]] || rdma_vm_die "apt-get download linux-image-$kver produced no .deb"
  fi
  rdma_vm_log "unpacking $(basename "$deb")"
  rm -rf "$kdir"
  mkdir -p "$kdir"
  dpkg -x "$deb" "$kdir"
  [[ -r $kdir/boot/vmlinuz-$kver ]] || rdma_vm_die "no vmlinuz-$kver in $deb"
  depmod -b "$kdir" "$kver"
  touch "$kdir/.complete"
}

# --- 3. initramfs -----------------------------------------------------------------
initramfs_key() {
  local kver=$1
  {
    printf 'kernel %s\n' "$kver"
    printf 'modules %s\n' "${RDMA_VM_MODULES[*]}"
    sha256sum "$RDMA_VM_DIR/initramfs-init" | cut -d' ' -f1
    sha256sum /bin/busybox | cut -d' ' -f1
    # The builder below is part of the key too.
    declare -f build_initramfs | sha256sum | cut -d' ' -f1
  } 2>/dev/null
}

build_initramfs() {
  local kver=$1 kdir=$RSOCK_VM_CACHE/kernel/$1 out=$RSOCK_VM_CACHE/initramfs-$1.cpio.gz
  local work m f base
  work=$(mktemp -d "${TMPDIR:-/tmp}/rdma-vm-initramfs.XXXXXX")
  # shellcheck disable=SC2064 # expand $work now
  trap "rm -rf '$work'" RETURN
  mkdir -p "$work"/{bin,dev,proc,sys,modules}
  cp /bin/busybox "$work/bin/busybox"
  ldd "$work/bin/busybox" >/dev/null 2>&1 && rdma_vm_die "/bin/busybox is not static (install busybox-static)"
  install -m 0755 "$RDMA_VM_DIR/initramfs-init" "$work/init"
  # The kernel opens /dev/console for PID 1 before devtmpfs is mounted.
  mknod -m 600 "$work/dev/console" c 5 1 2>/dev/null || true

  # Every module with its dependencies, in load order, each once.
  declare -A seen=()
  : >"$work/modules/order"
  for m in "${RDMA_VM_MODULES[@]}"; do
    while read -r f; do
      base=$(basename "$f")
      base=${base%.xz}; base=${base%.zst}; base=${base%.gz}
      [[ -n ${seen[$base]:-} ]] && continue
      seen[$base]=1
      case "$f" in
        *.ko.xz) xz -dc "$f" >"$work/modules/$base" ;;
        *.ko.zst) zstd -qdc "$f" >"$work/modules/$base" ;;
        *.ko.gz) gzip -dc "$f" >"$work/modules/$base" ;;
        *) cp "$f" "$work/modules/$base" ;;
      esac
      printf '%s\n' "$base" >>"$work/modules/order"
    done < <(modprobe -d "$kdir" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }')
  done
  [[ -s $work/modules/order ]] || rdma_vm_die "no modules resolved for $kver"

  (cd "$work" && find . -print0 | cpio --null -o -H newc --quiet -R 0:0 | gzip -1) >"$out.tmp"
  mv "$out.tmp" "$out"
  rdma_vm_log "initramfs: $(wc -l <"$work/modules/order") modules, $(du -h "$out" | cut -f1)"
}

# --- main -------------------------------------------------------------------------
main() {
  local missing kver stamp key
  mapfile -t missing < <(missing_packages)
  if (( check_only )); then
    (( ${#missing[@]} == 0 )) || exit 1
    kver=$(rdma_vm_kver) || exit 1
    [[ -e $RSOCK_VM_CACHE/kernel/$kver/.complete ]] || exit 1
    [[ -r $RSOCK_VM_CACHE/initramfs-$kver.cpio.gz ]] || exit 1
    [[ "$(cat "$RSOCK_VM_CACHE/initramfs-$kver.stamp" 2>/dev/null)" == "$(initramfs_key "$kver")" ]] || exit 1
    exit 0
  fi

  if (( ${#missing[@]} )); then
    [[ $(id -u) == 0 ]] || rdma_vm_die "missing packages (${missing[*]}); run as root to install them"
    apt_update_once
    rdma_vm_log "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi

  kver=${RSOCK_VM_KERNEL:-$(resolve_kver)}
  mkdir -p "$RSOCK_VM_CACHE"
  fetch_kernel "$kver"

  stamp=$RSOCK_VM_CACHE/initramfs-$kver.stamp
  key=$(initramfs_key "$kver")
  if [[ ! -r $RSOCK_VM_CACHE/initramfs-$kver.cpio.gz || "$(cat "$stamp" 2>/dev/null)" != "$key" ]]; then
    build_initramfs "$kver"
    printf '%s\n' "$key" >"$stamp"
  fi
  printf '%s\n' "$kver" >"$RSOCK_VM_CACHE/current"
  rdma_vm_log "ready: kernel $kver, cache $RSOCK_VM_CACHE"
}

# One setup at a time per cache (run.sh calls setup.sh when the bed is stale, and
# several runs may start together).
mkdir -p "$RSOCK_VM_CACHE"
exec 9>"$RSOCK_VM_CACHE/.setup.lock"
flock 9
main
