#!/usr/bin/env bash
# Install test (host only, root not needed): `make install` into a temporary DESTDIR with
# PREFIX=/usr (its man pages rendering without warnings and its bash, zsh and fish
# completions, all written by the rsock just built), the installed `rsock run` finding and
# loading the installed shim with no RSOCK_LIB, the shim's SONAME, `make uninstall`, and the
# Debian package of scripts/deb.sh: its file list, conffile and dependencies, installed into
# a throwaway root with `dpkg --root --force-not-root`, and the rsock in there running a
# program with its shim.
#
# usage: tests/install.sh [CELL_PATTERN]
#   T_KEEP=1   keep the work dir (it is always kept when a cell fails)
# Runs `make install` and scripts/deb.sh, which build the release shim and CLI first.
#
# Needs: make, dpkg-dev (dpkg-deb, dpkg-shlibdeps), binutils (readelf, strip), python3,
# man-db (man), coreutils.

set -u
. "$(dirname "$0")/lib/common.sh"
need make dpkg dpkg-deb readelf strip python3 man timeout
# The release shim and CLI must exist before t_init looks for them; built with the PREFIX
# the cells install to, so that their `make install` and scripts/deb.sh build nothing again.
(cd "$T_ROOT" && make --no-print-directory build PREFIX=/usr >/dev/null) || { echo "make build failed" >&2; exit 2; }
t_init
PATTERN=${1:-}
DEST=$T_WORK/dest          # make install DESTDIR
BYTES=300000               # what the client sends
# The man pages (rsock.1 and one per command) and completions make install writes.
MANPAGES=(rsock rsock-run rsock-stat rsock-rules rsock-check rsock-log rsock-completions)
COMPLETIONS=(usr/share/bash-completion/completions/rsock usr/share/zsh/vendor-completions/_rsock
    usr/share/fish/vendor_completions.d/rsock.fish)

# A listener that takes one connection, reads it to the end and writes the byte count to
# FILE; it runs without the shim.
# usage: bg srv SECS python3 -c "$SERVER" PORT FILE
SERVER='import socket,sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    n += len(b)
open(sys.argv[2], "w").write(str(n))'

# The client: connects, sends N bytes, closes; prints the LD_PRELOAD it was given and every
# librsock.so mapped into it (from /proc/self/maps).
CLIENT='import socket,sys,os
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"x" * int(sys.argv[2])); s.close()
print("LD_PRELOAD=" + os.environ.get("LD_PRELOAD", ""))
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("/librsock.so")})
print("mapped=" + ":".join(maps))'

# run_installed ROOT LABEL: ROOT/usr/bin/rsock runs the client (no RSOCK_LIB, LD_PRELOAD
# unset) against a plain listener; the client must have had ROOT/usr/lib/rsock/librsock.so
# preloaded and mapped, the shim must have logged its start and counted the connection and
# its bytes, and ROOT's `rsock stat` must show the process.
run_installed() {
    local root=$1 label=$2 lib=$1/usr/lib/rsock/librsock.so
    local st=$CELL_DIR/$label.stats log=$CELL_DIR/$label.log
    [ -x "$root/usr/bin/rsock" ] || fail "$label: no $root/usr/bin/rsock"
    bg srv 30 python3 -c "$SERVER" "$PORT" "$CELL_DIR/$label.count"
    wait_listen "$PORT" 10 srv || fail "$label: listener did not start"
    local rc=0
    (cd / && timeout 30 env -u RSOCK_LIB -u LD_PRELOAD RSOCK_STATS_DIR="$st" RSOCK_STATS_KEEP=1 \
        "$root/usr/bin/rsock" run --log "$log" -- python3 -c "$CLIENT" "$PORT" "$BYTES") \
        > "$label.out" 2> "$label.err" || rc=$?
    [ "$rc" = 0 ] || fail "$label: rsock run exited $rc: $(head -c 400 "$label.err")"
    expect_status srv 0
    [ "$(cat "$CELL_DIR/$label.count")" = "$BYTES" ] ||
        fail "$label: the listener got $(cat "$CELL_DIR/$label.count") bytes, want $BYTES"
    grep -qxF "LD_PRELOAD=$lib" "$label.out" ||
        fail "$label: the program's LD_PRELOAD is not the installed shim: $(grep LD_PRELOAD "$label.out")"
    grep -qxF "mapped=$lib" "$label.out" ||
        fail "$label: the installed shim is not (only) what is mapped: $(grep mapped= "$label.out")"
    expect_empty "$label.err" "$label: rsock run's stderr"
    [ "$(grep -c 'starting in pid' "$log" 2>/dev/null)" = 1 ] ||
        fail "$label: the shim's log has no (or not one) start line: $(head -c 300 "$log" 2>/dev/null)"
    expect_stats "$st" "$label" -D N="$BYTES" 'nproc==1' \
        'getattr(conns, "tcp", 0) + getattr(conns, "passthrough", 0) == 1' \
        'getattr(tx, "tcp", 0) + getattr(tx, "passthrough", 0) == N' 'comms==["python3"]'
    local shown
    shown=$("$root/usr/bin/rsock" stat --all --dir "$st") || fail "$label: $root/usr/bin/rsock stat failed"
    grep -q '^pid [0-9]* python3' <<< "$shown" || fail "$label: rsock stat does not show the client: $shown"
}

# ---- make install ------------------------------------------------------------------------

cell_make_install() {
    (cd "$T_ROOT" && make --no-print-directory install DESTDIR="$DEST" PREFIX=/usr) > make.out 2>&1 ||
        fail "make install failed: $(tail -c 400 make.out)"
    local f p want=(usr/bin/rsock usr/lib/rsock/librsock.so etc/rsock.conf "${COMPLETIONS[@]}")
    for p in "${MANPAGES[@]}"; do want+=("usr/share/man/man1/$p.1"); done
    for f in "${want[@]}"; do [ -f "$DEST/$f" ] || fail "make install did not install /$f"; done
    local got
    got=$(cd "$DEST" && find . -type f | sed 's|^\./||' | sort | paste -sd' ')
    [ "$got" = "$(printf '%s\n' "${want[@]}" | sort | paste -sd' ')" ] || fail "installed files: $got"
    readelf -d "$DEST/usr/lib/rsock/librsock.so" | grep -q 'SONAME.*\[librsock\.so\]' ||
        fail "no SONAME librsock.so: $(readelf -d "$DEST/usr/lib/rsock/librsock.so" | grep -i soname)"
    # The example config: every line accepted, as installed and with its examples uncommented.
    "$DEST/usr/bin/rsock" rules "$DEST/etc/rsock.conf" > rules.out 2>&1 ||
        fail "rsock rules rejects the installed /etc/rsock.conf: $(cat rules.out)"
    sed -E 's/^# ((rdma|tcp|passthrough) )/\1/' "$DEST/etc/rsock.conf" > uncommented.conf
    "$DEST/usr/bin/rsock" rules uncommented.conf > rules2.out 2>&1 ||
        fail "rsock rules rejects the uncommented examples: $(cat rules2.out)"
    grep -Eq ': [1-9][0-9]* rule\(s\), 0 line\(s\) ignored' rules2.out ||
        fail "no example rule in /etc/rsock.conf: $(tail -n1 rules2.out)"
    # An admin's /etc/rsock.conf survives a second install.
    echo "tcp port=1" > "$DEST/etc/rsock.conf"
    (cd "$T_ROOT" && make --no-print-directory install DESTDIR="$DEST" PREFIX=/usr) > make2.out 2>&1 ||
        fail "second make install failed"
    [ "$(cat "$DEST/etc/rsock.conf")" = "tcp port=1" ] || fail "make install replaced an existing /etc/rsock.conf"
    # Every man page is found by name in the installed tree and renders without warnings;
    # rsock(1) has the main page's prose, rsock-run(1) run's options.
    local w
    for p in "${MANPAGES[@]}"; do
        w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -M "$DEST/usr/share/man" "$p" 2>&1 >"$p.txt")
        [ -z "$w" ] && [ -s "$p.txt" ] || fail "man page $p: ${w:-nothing rendered}"
        [ "$(stat -c %a "$DEST/usr/share/man/man1/$p.1")" = 644 ] || fail "$p.1 is not mode 644"
    done
    for w in 'rsock run' ENVIRONMENT 'EXIT STATUS' EXAMPLES 'rsock-stat(1)'; do
        grep -qF "$w" rsock.txt || fail "rsock(1) has no $w: $(head -c 600 rsock.txt)"
    done
    grep -q -- '--log-level' rsock-run.txt || fail "rsock-run(1) has no --log-level"
    # The completions: bash's defines the completion; zsh's and fish's are for rsock (and
    # parse, where the shell is installed).
    bash -c ". '$DEST/${COMPLETIONS[0]}' && complete -p rsock" > compl.out 2>&1 ||
        fail "bash completion: $(cat compl.out)"
    head -n1 "$DEST/${COMPLETIONS[1]}" | grep -qx '#compdef rsock' ||
        fail "zsh completion: $(head -n1 "$DEST/${COMPLETIONS[1]}")"
    grep -q '^complete -c rsock ' "$DEST/${COMPLETIONS[2]}" || fail "fish completion: no complete -c rsock"
    if command -v zsh >/dev/null; then
        zsh -n "$DEST/${COMPLETIONS[1]}" 2> zsh.err || fail "zsh -n: $(cat zsh.err)"
    fi
    if command -v fish >/dev/null; then
        fish -n "$DEST/${COMPLETIONS[2]}" 2> fish.err || fail "fish -n: $(cat fish.err)"
    fi
    for f in "${COMPLETIONS[@]}"; do
        [ "$(stat -c %a "$DEST/$f")" = 644 ] || fail "/$f is not mode 644"
    done
}

# The installed rsock finds the installed shim (../lib/rsock) with no RSOCK_LIB, and it is
# loaded; without it, rsock refuses and names every place it looked.
cell_installed_run() {
    [ -x "$DEST/usr/bin/rsock" ] || fail "needs make_install first"
    run_installed "$DEST" destdir
    mv "$DEST/usr/lib/rsock/librsock.so" "$DEST/usr/lib/rsock/moved.so"
    local rc=0
    env -u RSOCK_LIB "$DEST/usr/bin/rsock" run -- true 2> noshim.err || rc=$?
    mv "$DEST/usr/lib/rsock/moved.so" "$DEST/usr/lib/rsock/librsock.so"
    [ "$rc" = 126 ] || fail "without the shim rsock run exited $rc, want 126"
    local p
    for p in "$DEST/usr/bin/librsock.so" "$DEST/usr/lib/rsock/librsock.so" "/usr/lib/rsock/librsock.so"; do
        grep -qF "$p" noshim.err || fail "the error does not name $p: $(cat noshim.err)"
    done
}

# make uninstall removes everything make install put there but the changed /etc/rsock.conf
# (cell_make_install left an admin's one); a second make install puts it all back.
cell_make_uninstall() {
    [ -x "$DEST/usr/bin/rsock" ] || fail "needs make_install first"
    (cd "$T_ROOT" && make --no-print-directory uninstall DESTDIR="$DEST" PREFIX=/usr) > uninstall.out 2>&1 ||
        fail "make uninstall failed: $(tail -c 400 uninstall.out)"
    local got
    got=$(cd "$DEST" && find . -type f | sed 's|^\./||' | sort | paste -sd' ')
    [ "$got" = etc/rsock.conf ] || fail "left after make uninstall: $got"
    (cd "$T_ROOT" && make --no-print-directory install DESTDIR="$DEST" PREFIX=/usr) > make3.out 2>&1 ||
        fail "make install after uninstall failed: $(tail -c 400 make3.out)"
    [ -f "$DEST/usr/share/man/man1/rsock-run.1" ] || fail "no rsock-run.1 after installing again"
}

# ---- the Debian package ------------------------------------------------------------------

cell_deb() {
    local deb
    deb=$(cd "$T_ROOT" && scripts/deb.sh 2> "$CELL_DIR/deb.err") || fail "scripts/deb.sh failed: $(tail -c 400 deb.err)"
    deb=$T_ROOT/$deb
    [ -f "$deb" ] || fail "no package at $deb"
    dpkg-deb -c "$deb" | awk '{print $6}' | grep -v '/$' | sort > files.txt
    local want p
    want=$( {
        printf '%s\n' ./etc/rsock.conf ./usr/bin/rsock ./usr/lib/rsock/librsock.so \
            ./usr/share/doc/rsock/copyright
        printf './%s\n' "${COMPLETIONS[@]}"
        for p in "${MANPAGES[@]}"; do echo "./usr/share/man/man1/$p.1.gz"; done
    } | sort)
    [ "$(cat files.txt)" = "$want" ] || fail "package files: $(paste -sd' ' files.txt)"
    dpkg-deb -c "$deb" | awk '{print $2}' | sort -u | grep -qvx 'root/root' &&
        fail "files not owned by root/root: $(dpkg-deb -c "$deb" | awk '{print $2}' | sort -u | paste -sd' ')"
    [ "$(dpkg-deb -f "$deb" Package)" = rsock ] || fail "Package: $(dpkg-deb -f "$deb" Package)"
    local dep
    dep=$(dpkg-deb -f "$deb" Depends)
    for want in 'libc6 (>= ' libibverbs1 librdmacm1; do
        grep -qF "$want" <<< "$dep" || fail "Depends lacks $want: $dep"
    done
    dpkg-deb -I "$deb" conffiles > conffiles.txt 2>&1 || fail "no conffiles in the package"
    [ "$(cat conffiles.txt)" = /etc/rsock.conf ] || fail "conffiles: $(cat conffiles.txt)"
    # Stripped for the package: the SONAME must survive.
    dpkg-deb -x "$deb" x
    readelf -d x/usr/lib/rsock/librsock.so | grep -q 'SONAME.*\[librsock\.so\]' || fail "packaged shim has no SONAME"
    local w
    for p in "${MANPAGES[@]}"; do
        w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "x/usr/share/man/man1/$p.1.gz" 2>&1 >/dev/null)
        [ -z "$w" ] || fail "packaged $p.1.gz: $w"
    done

    # Installed into a throwaway root (no maintainer scripts, so no chroot: works unprivileged).
    local root=$CELL_DIR/root
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
    touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
    dpkg_root() { dpkg --root="$root" --force-not-root --force-depends --log="$CELL_DIR/dpkg.log" "$@"; }
    dpkg_root -i "$deb" > dpkg.out 2>&1 || fail "dpkg -i failed: $(tail -c 400 dpkg.out)"
    dpkg_root -s rsock 2>/dev/null | grep -qx 'Status: install ok installed' ||
        fail "rsock not installed in the root: $(dpkg_root -s rsock 2>&1 | head -3)"
    run_installed "$root" deb
    # The conffile: an admin's change survives a reinstall, and removal (not purge) keeps it.
    echo "passthrough prog=sshd" > "$root/etc/rsock.conf"
    dpkg_root -i "$deb" > dpkg2.out 2>&1 || fail "dpkg -i again failed: $(tail -c 400 dpkg2.out)"
    [ "$(cat "$root/etc/rsock.conf")" = "passthrough prog=sshd" ] || fail "reinstall replaced the changed conffile"
    dpkg_root -r rsock > dpkg3.out 2>&1 || fail "dpkg -r failed: $(tail -c 400 dpkg3.out)"
    [ ! -e "$root/usr/bin/rsock" ] && [ ! -e "$root/usr/lib/rsock/librsock.so" ] || fail "dpkg -r left the binaries"
    [ -f "$root/etc/rsock.conf" ] || fail "dpkg -r removed the conffile"
}

# ---- run ----------------------------------------------------------------------------------

CELLS=(make_install installed_run make_uninstall deb)
for c in "${CELLS[@]}"; do
    [ -z "$PATTERN" ] || [[ $c == *$PATTERN* ]] || continue
    t_cell "$c" "cell_$c"
done
t_summary
