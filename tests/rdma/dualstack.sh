#!/usr/bin/env bash
# Dual-stack sockets over RDMA (issue #20): AF_INET6 sockets reaching IPv4 peers through
# IPv4-mapped addresses, servers bound to [::] with IPV6_V6ONLY off — Python's
# create_server(dualstack_ipv6=True), the JVM (every socket AF_INET6), nginx `listen [::]
# ipv6only=off` — both ends under the shim, in the Soft-RoCE guest. Each cell checks the data
# (sha256), the shim's counters at both ends (RDMA, nothing on kernel TCP), the device (RC QPs
# while the transfer runs, rxe0 packets >= bytes/active_mtu, none left after), and the
# addresses the programs get back against what the kernel returns on such sockets
# (dualstack/check.py: ::ffff:a.b.c.d in a 28-byte sockaddr_in6, flowinfo and scope 0).
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh --timeout 1500 -- tests/rdma/dualstack.sh [PATTERN[,PATTERN...]]
#
# Environment: T_MB (MiB echoed per connection, default 8), T_KEEP=1 (keep the work dir),
# SHIM_LOG_LEVEL (default debug here: the cells read the shim's "over RDMA" lines).
# Prints "PASS cell (Ns)" / "FAIL cell: why", then "N passed, N failed"; exit 1 on failure.

set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
# shellcheck source=fork/servers.sh
. tests/rdma/fork/servers.sh
need python3 curl ss timeout sha256sum rdma ibv_devinfo ip java javac nginx apache2ctl
PATTERN=${1:-}
MB=${T_MB:-8}
MUT=0
A=$RDMA_VM_ADDR     # 10.77.0.1: veth0, carries rxe0
A6=fd77::1          # native IPv6 on veth0 (added below: rxe0 lists it as a RoCE v2 GID)
D=$T_ROOT/tests/rdma/dualstack
T=300               # per-process bound, seconds (the JVM starts slowly under TCG)
CTO=10000           # RSOCK_CONNECT_TIMEOUT_MS
SHIM_LOG_LEVEL=${SHIM_LOG_LEVEL:-debug}
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/dualstack-$RUN_ID
ulimit -l unlimited 2>/dev/null || true
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}

# Native IPv6 on the rxe netdev: the guest's veth0 has only a link-local address; a global
# one appears in rxe0's GID table (as RoCE v2) once added, and rdma_cm reaches it.
ip -6 addr show dev veth0 | grep -q "$A6/" || ip -6 addr add "$A6/64" dev veth0 nodad
wait_until 10 grep -qi '^fd77:' /sys/class/infiniband/rxe0/ports/1/gids/* ||
    echo "# warning: rxe0 lists no GID for $A6"
echo "# data: ${MB} MiB per connection, active_mtu $MTU, work dir $T_WORK;" \
    "rxe0 GIDs: $(cat /sys/class/infiniband/rxe0/ports/1/gids/[0-3] | paste -sd' ')"
chmod 755 "$T_WORK"  # nginx's workers (nobody) read the data through it
DATA=$T_WORK/data.bin
make_random "$DATA" "$MB"
SIZE=$(stat -c %s "$DATA")

# ---- helpers ----------------------------------------------------------------------------------

# py_client NAME FAMILY HOST: a shimmed echo client (stats CELL_DIR/NAME, report NAME.json).
py_client() {
    bg "$1" $T shimmed "$CELL_DIR/$1" python3 "$D/client.py" "$2" "$3" "$PORT" "$DATA" \
        "$CELL_DIR/$1.bin" "$CELL_DIR/$1.json"
}

# echo_ok NAME...: each client exited 0 and got the file back.
echo_ok() {
    local n
    for n in "$@"; do
        expect_status "$n" 0
        soft expect_same_file "$DATA" "$n.bin" "$n"
    done
}

# expect_log LOG REGEX: the shim log LOG has a line matching REGEX (the shim's own words).
expect_log() {
    grep -qE "$2" "$1" || fail "$(basename "$1"): no line matching '$2'"
}

# curls_round PLAIN_URL URL...: a shimmed curl of each URL (cli1.. into got1.bin..) and a
# plain one of PLAIN_URL (plain.bin, kernel TCP) at once; waits for them and stops the server
# (bg srv). Sets CURLS_BAD to the curls that failed; curls_bodies checks what they got.
# The shimmed curls read at most 2 MB/s, so that each transfer lasts about 4 s and its queue
# pairs are listed by several of rdma_begin's samples (every 0.5 s): unthrottled, CI
# (2026-11-29) finished all three between two samples and saw no RC QP.
curls_round() {
    local plain=$1 i=0 u n rc; shift
    for u in "$@"; do
        i=$((i + 1))
        bg "cli$i" $T shimmed "$CELL_DIR/cli" curl -g -sS --fail --max-time 120 --limit-rate 2M \
            -o "$CELL_DIR/got$i.bin" "$u"
    done
    CURLS_N=$i
    bg plain $T curl -4 -sS --fail --max-time 120 -o "$CELL_DIR/plain.bin" "$plain"
    CURLS_BAD=()
    for n in $(seq -f 'cli%g' 1 "$CURLS_N") plain; do
        rc=0; bg_wait "$n" || rc=$?
        [ $rc -eq 0 ] || CURLS_BAD+=("$n: status $rc $(tail -c 150 "$n.err" | paste -sd' ')")
    done
    bg_stop srv
}

# curls_bodies: after curls_round, every curl succeeded and got the data file.
curls_bodies() {
    [ ${#CURLS_BAD[@]} -eq 0 ] || fail "curl failed: ${CURLS_BAD[*]}"
    local i
    for i in $(seq 1 "$CURLS_N"); do soft expect_same_file "$DATA" "got$i.bin" "curl $i"; done
    soft expect_same_file "$DATA" plain.bin "plain curl"
}

# ---- (a) Python dual-stack server ----------------------------------------------------------------

# An IPv4 client and an IPv4-mapped AF_INET6 client, one after the other, on one
# create_server(dualstack_ipv6=True) listener.
cell_py_dualstack() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$D/server.py" dual "$PORT" 2 "$CELL_DIR/srv.json"
    wait_dual srv
    py_client cv4 4 "$A"
    expect_status cv4 0
    py_client cmap 6 "::ffff:$A"
    echo_ok cv4 cmap
    expect_status srv 0
    soft rdma_end $((4 * SIZE)) 2
    local out; out=$(python3 "$D/check.py" srv.json "$A" "$PORT" cv4.json:v4 cmap.json:mapped) ||
        soft fail "addresses: $(echo "$out" | head -3 | paste -sd';')"
    echo "# server accept(): $(python3 -c 'import json,sys; print(*[json.loads(l)["accepted"] for l in open(sys.argv[1])])' srv.json)"
    soft expect_rdma srv 2 -D S="$SIZE" 'nproc==1' 'rx.rdma==2*S' 'tx.rdma==2*S'
    soft expect_rdma cv4 1 -D S="$SIZE" 'nproc==1' 'rx.rdma==S' 'tx.rdma==S'
    soft expect_rdma cmap 1 -D S="$SIZE" 'nproc==1' 'rx.rdma==S' 'tx.rdma==S'
    soft expect_log cmap.log "connected to \[::ffff:$A\]:$PORT over RDMA"
    expect_qps_released
}

# A native IPv6 client on the same kind of listener (rxe0 has a GID for fd77::1).
cell_py_dualstack_native_v6() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$D/server.py" dual "$PORT" 2 "$CELL_DIR/srv.json"
    wait_dual srv
    py_client c6 6 "$A6"
    expect_status c6 0
    py_client cv4 4 "$A"
    echo_ok c6 cv4
    expect_status srv 0
    soft rdma_end $((4 * SIZE)) 2
    local out; out=$(python3 "$D/check.py" srv.json "$A" "$PORT" c6.json:v6 cv4.json:v4) ||
        soft fail "addresses: $(echo "$out" | head -3 | paste -sd';')"
    soft expect_rdma srv 2 -D S="$SIZE" 'nproc==1' 'rx.rdma==2*S' 'tx.rdma==2*S'
    soft expect_rdma c6 1 -D S="$SIZE" 'rx.rdma==S' 'tx.rdma==S'
    soft expect_rdma cv4 1 -D S="$SIZE" 'rx.rdma==S' 'tx.rdma==S'
    expect_qps_released
}

# An AF_INET6 socket bound to the mapped form of one address (the log of issue #20:
# "rdma_bind_addr: Cannot assign requested address").
cell_py_bound_mapped() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$D/server.py" "::ffff:$A" "$PORT" 2 "$CELL_DIR/srv.json"
    wait_dual srv
    py_client cv4 4 "$A"
    expect_status cv4 0
    py_client cmap 6 "::ffff:$A"
    echo_ok cv4 cmap
    expect_status srv 0
    soft rdma_end $((4 * SIZE)) 2
    local out; out=$(python3 "$D/check.py" srv.json "$A" "$PORT" cv4.json:v4 cmap.json:mapped) ||
        soft fail "addresses: $(echo "$out" | head -3 | paste -sd';')"
    soft expect_rdma srv 2 -D S="$SIZE" 'rx.rdma==2*S' 'tx.rdma==2*S'
    soft expect_rdma cv4 1
    soft expect_rdma cmap 1
    expect_qps_released
}

# ---- (b) IPV6_V6ONLY is respected ---------------------------------------------------------------

# A v6-only [::] server: an IPv4 client and a mapped one are refused, as by the kernel (the
# rdma_cm listener has AFONLY set: no IPv4 request reaches it), promptly; a native IPv6
# client still gets RDMA.
cell_v6only_refuses_ipv4() {
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$D/server.py" v6only "$PORT" 1 "$CELL_DIR/srv.json"
    wait_dual srv
    local t0=$SECONDS
    py_client cv4 4 "$A"
    expect_status cv4 3
    grep -q refused cv4.err || fail "IPv4 client: not 'connection refused': $(head -c 200 cv4.err)"
    py_client cmap 6 "::ffff:$A"
    expect_status cmap 3
    [ $((SECONDS - t0)) -le 60 ] || fail "refusals took $((SECONDS - t0)) s"
    echo "# refused in $((SECONDS - t0)) s"
    py_client c6 6 "$A6"
    echo_ok c6
    expect_status srv 0
    soft expect_rdma c6 1 -D S="$SIZE" 'rx.rdma==S' 'tx.rdma==S'
    soft expect_rdma srv 1
    local out; out=$(python3 "$D/check.py" srv.json "$A" "$PORT" c6.json:v6) ||
        soft fail "addresses: $(echo "$out" | head -3 | paste -sd';')"
    expect_qps_released
}

# A dual-stack server without the shim: the shimmed IPv4 and mapped clients find no rdma_cm
# listener and fall back to kernel TCP (reason rejected), with the kernel's addresses.
cell_fallback_plain_server() {
    bg srv $T python3 "$D/server.py" dual "$PORT" 2 "$CELL_DIR/srv.json"
    wait_listen "$PORT" 60 srv || fail "server did not listen"
    py_client cv4 4 "$A"
    expect_status cv4 0
    py_client cmap 6 "::ffff:$A"
    echo_ok cv4 cmap
    expect_status srv 0
    local out; out=$(python3 "$D/check.py" srv.json "$A" "$PORT" cv4.json:v4 cmap.json:mapped) ||
        soft fail "addresses: $(echo "$out" | head -3 | paste -sd';')"
    soft expect_stats "$CELL_DIR/cv4" cv4 -D S="$SIZE" 'conns.tcp==1' 'conns.rdma==0' 'fallback.rejected==1' 'tx.tcp==S'
    soft expect_stats "$CELL_DIR/cmap" cmap -D S="$SIZE" 'conns.tcp==1' 'conns.rdma==0' 'tx.tcp==S' \
        'fallback.rejected + fallback.negative_cache==1'
}

# ---- (c) Java: NIO server, blocking client (every JVM socket is AF_INET6) --------------------

# Small, serial JVMs: the guest has 2 GiB and TCG is slow.
JVM=(java -Xmx64m -Xss256k -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData)
# javac is the cell's build step and runs without the shim. Under TCG a JVM has been seen to
# die once in its own C1-compiled code (CI, 2026-11-29: a fatal error in
# CharacterDataLatin1.isJavaIdentifierPart); such a crash, which leaves an hs_err file, is
# retried. A compile error is not.
compile_java() {
    local try err
    for try in 1 2 3; do
        err="$CELL_DIR/javac-hs_err-$try.log"
        env -u LD_PRELOAD javac -J-XX:ErrorFile="$err" -d "$CELL_DIR/classes" "$D"/java/*.java && return 0
        [ -e "$err" ] || return 1
        echo "# javac: the JVM crashed (try $try, $(grep -m1 -o 'SIG[A-Z]*' "$err")); compiling again"
    done
    return 1
}

cell_java() {
    compile_java || fail "javac failed"
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" "${JVM[@]}" -cp classes EchoServer "$PORT" 2
    wait_dual srv
    bg c1 $T shimmed "$CELL_DIR/c1" "${JVM[@]}" -cp classes EchoClient "$A" "$PORT" "$DATA" "$CELL_DIR/c1.bin"
    expect_status c1 0
    bg c2 $T shimmed "$CELL_DIR/c2" "${JVM[@]}" -cp classes EchoClient "::ffff:$A" "$PORT" "$DATA" "$CELL_DIR/c2.bin"
    echo_ok c1 c2
    expect_status srv 0
    echo "# $(paste -sd' ' srv.out)"
    soft rdma_end $((4 * SIZE)) 2
    soft expect_rdma srv 2 -D S="$SIZE" 'rx.rdma==2*S' 'tx.rdma==2*S'
    soft expect_rdma c1 1 -D S="$SIZE" 'rx.rdma==S' 'tx.rdma==S'
    soft expect_rdma c2 1 -D S="$SIZE" 'rx.rdma==S' 'tx.rdma==S'
    # The JVM's sockets are AF_INET6: the shim saw mapped addresses on both sides.
    soft expect_log c1.log "connected to \[::ffff:$A\]:$PORT over RDMA"
    soft expect_log srv.log "listening on \[::\]:$PORT over kernel TCP and RDMA"
    expect_qps_released
}

# ---- (d) nginx listen [::]:PORT ipv6only=off ----------------------------------------------------

# Two shimmed curls on IPv4, one on the mapped address, one plain curl (kernel TCP, the
# expected peer_tcp). nginx runs with no `user` line (servers.sh): its workers, as nobody,
# take the connections over.
cell_nginx_dualstack() {
    nginx_conf "$CELL_DIR" "[::]" "$PORT" off "ipv6only=off"
    ln -sf "$DATA" www/data.bin
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" nginx -p "$CELL_DIR" -c "$CELL_DIR/nginx.conf" -e "$CELL_DIR/nginx-error.log"
    wait_dual srv
    local url="http://$A:$PORT/data.bin"
    curls_round "$url" "$url" "$url" "http://[::ffff:$A]:$PORT/data.bin"
    curls_bodies
    soft rdma_end $((3 * SIZE)) 2
    soft expect_stats "$CELL_DIR/cli" cli 'nproc==3' 'conns.rdma==3' 'conns.tcp==0'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma>=3' 'conns.tcp==1' 'fallback.peer_tcp==1'
    local e
    e=$(grep -E '\[(alert|crit|emerg)\]' nginx-error.log | head -n 3 | paste -sd'|')
    [ -z "$e" ] || soft fail "nginx error log: $e"
    expect_qps_released
}

# ---- (e) web servers as Debian ships them -------------------------------------------------------

# packaged_round NAME LOGDIR: with the server NAME started from its packaged configuration on
# port 80, two shimmed curls on IPv4 and one on native IPv6 take the workers' branches
# (RSOCK_REDIRECT is on by default); a plain curl is the expected peer_tcp fallback. Stops
# the server, copies its logs from LOGDIR, checks bytes, counters and the error log.
packaged_round() {
    local name=$1 logs=$2 url="http://$A/data.bin"
    curls_round "$url" "$url" "$url" "http://[$A6]/data.bin"
    cp "$logs/error.log" "$name-error.log" 2>/dev/null
    cp "$logs/access.log" "$name-access.log" 2>/dev/null
    rm -f /var/www/html/data.bin
    curls_bodies
    soft rdma_end $((3 * SIZE)) 2
    soft expect_stats "$CELL_DIR/cli" cli 'nproc==3' 'conns.rdma==3' 'conns.tcp==0' 'branches.connects>=1'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma>=3' 'conns.tcp==1' 'fallback.peer_tcp==1' 'branches.accepts>=1'
    soft expect_log cli.log "connected to \[$A6\]:80 over RDMA"
    local e
    e=$(grep -E '\[(alert|crit|emerg)\]|:(alert|crit|emerg)\]' "$name-error.log" | head -n 3 | paste -sd'|')
    [ -z "$e" ] || soft fail "$name error log: $e"
    expect_qps_released
}

# nginx's packaged /etc/nginx/nginx.conf and default site, untouched: `listen 80` and
# `listen [::]:80` (two sockets, the IPv6 one v6-only), www-data workers, `worker_processes
# auto`, accept_mutex off, sendfile with tcp_nopush (TCP_CORK), gzip.
cell_nginx_packaged() {
    local PORT=80
    ln -sf "$DATA" /var/www/html/data.bin
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" nginx -g 'daemon off;'
    wait_dual srv
    wait_until 30 test -s /run/nginx.pid || fail "nginx wrote no pid file: $(tail -c 300 /var/log/nginx/error.log)"
    echo "# listeners: $(ss -Hltn 'sport = :80' | awk '{ print $4 }' | paste -sd' ');" \
        "workers: $(ps -o user= --ppid "$(cat /run/nginx.pid)" | sort | uniq -c | paste -sd' ')"
    packaged_round nginx /var/log/nginx
}

# Apache httpd as Debian ships it (`apache2ctl -D FOREGROUND`, as container images run it):
# the event MPM (threaded children, a listener thread each), `Listen 80` (one dual-stack [::]
# socket: IPv4 clients are mapped), www-data children.
cell_apache_packaged() {
    local PORT=80
    # /var/lock is /run/lock, which systemd-tmpfiles makes at boot (the guest has no systemd).
    mkdir -p /run/lock
    ln -sf "$DATA" /var/www/html/data.bin
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" apache2ctl -D FOREGROUND
    wait_dual srv
    wait_until 30 test -s /var/run/apache2/apache2.pid || fail "apache wrote no pid file: $(tail -c 300 /var/log/apache2/error.log)"
    echo "# listeners: $(ss -Hltn 'sport = :80' | awk '{ print $4 }' | paste -sd' ');" \
        "children: $(ps -o user= --ppid "$(cat /var/run/apache2/apache2.pid)" | sort | uniq -c | paste -sd' ')"
    packaged_round apache /var/log/apache2
}

for c in py_dualstack py_dualstack_native_v6 py_bound_mapped v6only_refuses_ipv4 fallback_plain_server \
    java nginx_dualstack nginx_packaged apache_packaged; do
    selected "$c" && run_cell "$c"
done
t_summary
