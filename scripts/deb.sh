#!/usr/bin/env bash
# Builds a Debian package of rsock from this tree with nothing beyond dpkg-dev:
# `make install PREFIX=/usr` into a staging root, DEBIAN/control and DEBIAN/conffiles
# written here, `dpkg-deb --build --root-owner-group`.
#
#   scripts/deb.sh            -> target/deb/rsock_VERSION_ARCH.deb (its path is printed last)
#
#   VERSION         package version (default: the version in Cargo.toml)
#   DEB_MAINTAINER  the Maintainer field (default: the rsock authors <rsock@localhost>)
#
# Depends: what dpkg-shlibdeps finds for the binaries (libc6, libgcc-s1; resolved by hand
# from their DT_NEEDED and symbol versions when dpkg-shlibdeps is not installed), plus
# libibverbs1 and librdmacm1, which the shim dlopens when the host has an RDMA device (so
# no tool sees them). /etc/rsock.conf is a conffile: an upgrade keeps the admin's version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for c in dpkg-deb dpkg make install gzip strip; do
    command -v "$c" >/dev/null || { echo "deb.sh: $c not found (apt-get install dpkg-dev binutils make)" >&2; exit 2; }
done

version=${VERSION:-$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)}
[[ -n $version ]] || { echo "deb.sh: no version in Cargo.toml" >&2; exit 2; }
arch=$(dpkg --print-architecture)
out=target/deb
root=$PWD/$out/debian/rsock
rm -rf "$out/debian"
mkdir -p "$root"

make --no-print-directory install DESTDIR="$root" PREFIX=/usr >&2

# Debian's layout: stripped binaries, compressed man pages (rsock.1 and one per command, as
# make install has the rsock just built write them), the copyright file.
strip --strip-unneeded --remove-section=.comment "$root/usr/bin/rsock" "$root/usr/lib/rsock/librsock.so"
gzip -9n "$root"/usr/share/man/man1/*.1
doc=$root/usr/share/doc/rsock
install -d "$doc"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: rsock"
    echo
    echo "Files: *"
    echo "Copyright: the rsock authors"
    echo "License: MIT or Apache-2.0"
    echo " rsock is licensed under either of the MIT license or the Apache License,"
    echo " Version 2.0, at your option."
    echo " ."
    echo " The Apache License, Version 2.0 is in /usr/share/common-licenses/Apache-2.0."
    echo " ."
    echo " The MIT license:"
    echo " ."
    sed -e 's/^$/./' -e 's/^/ /' LICENSE-MIT
} > "$doc/copyright"
chmod 644 "$doc/copyright"

# Depends: the shared libraries the binaries are linked against.
bins=("$root/usr/bin/rsock" "$root/usr/lib/rsock/librsock.so")
shlibs=
if command -v dpkg-shlibdeps >/dev/null; then
    # It reads debian/control from its working directory: give it a minimal one.
    printf 'Source: rsock\n\nPackage: rsock\nArchitecture: any\n' > "$out/debian/control"
    # and takes the package's root to be the directory above the files that has DEBIAN/.
    mkdir -p "$root/DEBIAN"
    shlibs=$(cd "$out" && dpkg-shlibdeps -O "${bins[@]}" | sed -n 's/^shlibs:Depends=//p')
    rm -f "$out/debian/control"
fi
if [[ -z $shlibs ]]; then
    # By hand: libc6 at the newest GLIBC_ symbol version used; libgcc-s1 if linked.
    glibc=$(objdump -T "${bins[@]}" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
    shlibs="libc6 (>= ${glibc:-2.34})"
    readelf -d "${bins[@]}" | grep -q 'NEEDED.*libgcc_s\.so\.1' && shlibs+=", libgcc-s1"
fi

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: rsock
Version: $version
Architecture: $arch
Maintainer: ${DEB_MAINTAINER:-the rsock authors <rsock@localhost>}
Installed-Size: $size
Depends: $shlibs, libibverbs1, librdmacm1
Recommends: ibverbs-providers
Section: net
Priority: optional
Description: run unmodified TCP programs over RDMA
 librsock.so is an LD_PRELOAD shim that carries the TCP connections of unmodified
 programs over RDMA (rdma_cm RC connections, RDMA WRITE into registered rings) and falls
 back to kernel TCP wherever RDMA cannot serve. The rsock command runs programs with it
 (rsock run), shows its per-process counters and why each connection took its path
 (rsock stat), changes a running process's log level (rsock log), checks rules files
 (rsock rules) and whether this host and a peer can use RDMA (rsock check).
CONTROL
echo /etc/rsock.conf > "$root/DEBIAN/conffiles"
chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles"

deb=$out/rsock_${version}_${arch}.deb
dpkg-deb --build --root-owner-group "$root" "$deb" >&2
echo "$deb"
