#!/usr/bin/env bash
# Install what building and testing rsock needs on Debian 12, then build it (idempotent).
#
#   scripts/setup.sh            packages + release build of the shim, CLI and examples
#   scripts/setup.sh --no-build packages only
#
# Rust: uses cargo if it is on PATH and new enough (>= 1.80); otherwise installs Debian's
# rustc-web/cargo-web (1.9x, from bookworm-security). The Soft-RoCE test bed's own
# packages and kernel are prepared by tests/rdma-vm/setup.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACKAGES=(
  # build: gcc for the linker, rdma-sys's bindgen needs libclang and the rdma-core headers
  build-essential pkg-config libclang-dev libibverbs-dev librdmacm-dev
  # make install and the Debian package (tests/install.sh): dpkg-deb, dpkg-shlibdeps, readelf, man
  make dpkg-dev binutils man-db
  # RDMA userspace (used inside the test bed, which runs the host's binaries)
  rdma-core ibverbs-providers libibverbs1 librdmacm1 rdmacm-utils ibverbs-utils perftest
  # the programs the tests run under the shim, and the tools the tests use
  iperf3 iperf netcat-openbsd socat curl python3 iproute2 procps valgrind coreutils
  # servers that fork (tests/rdma/fork_matrix.sh, bench/rdma/fork.sh); never started on the host
  nginx ncat wrk postgresql util-linux haproxy openssh-server dovecot-imapd samba samba-vfs-modules smbclient
  # key-value servers (tests/rdma/shim_matrix.sh)
  redis-server redis-tools memcached libmemcached-tools
  # servers in their default configurations: workers that drop root, sockets passed between
  # processes (tests/rdma/fork_matrix.sh, tests/rdma/passed_fds.sh)
  apache2 gunicorn rsync systemd nodejs
  # the JVM, whose sockets are all AF_INET6 (tests/rdma/dualstack.sh)
  openjdk-17-jdk-headless
)

log() { printf 'setup: %s\n' "$*" >&2; }

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done

rust_ok() {
  command -v cargo >/dev/null 2>&1 || return 1
  local v
  v=$(rustc --version 2>/dev/null | sed -n 's/^rustc 1\.\([0-9]*\).*/\1/p')
  [[ -n $v && $v -ge 80 ]]
}
rust_ok || missing+=(rustc-web cargo-web)

if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Installing nginx/postgresql must not start them here: a policy-rc.d that says no, for
  # this install only (one that exists already is left alone).
  policy=
  [[ -e /usr/sbin/policy-rc.d ]] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy=1; }
  st=0
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || st=$?
  [[ -z $policy ]] || rm -f /usr/sbin/policy-rc.d
  ((st == 0)) || exit "$st"
fi
rust_ok || { log "no usable Rust toolchain (need cargo/rustc >= 1.80)"; exit 1; }
# scripts/test.sh runs cargo fmt and cargo clippy: a rustup toolchain may lack them.
if ! { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1 && command -v rustup >/dev/null; then
  log "rustup component add rustfmt clippy"
  rustup component add rustfmt clippy >/dev/null 2>&1 || log "could not add rustfmt/clippy: the fmt and clippy suites will fail"
fi

if [[ ${1:-} != --no-build ]]; then
  log "cargo build --release (shim, CLI, examples)"
  cargo build --release --workspace --lib --bins --examples --quiet
  log "built target/release/librsock.so and target/release/rsock"
fi
