#!/usr/bin/env bash
# The product surface in the Soft-RoCE guest: `rsock run`, the rules file, `rsock stat
# --watch`, and `rsock stat` refusing another user's counters. Every process is started with
# `rsock run` (the shim found next to the rsock binary); cells check the data (sha256), the
# shim's counters from `rsock stat --json`, and what the commands print.
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh --timeout 900 -- tests/rdma/product.sh [PATTERN[,PATTERN...]]
#
# Prints "PASS cell (Ns)" / "FAIL cell: why", then "N passed, N failed"; exit 1 on failure.

set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
# shellcheck source=../lib/common.sh
. tests/lib/common.sh
rdma_vm_require_guest
t_init
need nc.openbsd python3 ss timeout sha256sum rdma script setpriv pgrep
PATTERN=${1:-}
A=$RDMA_VM_ADDR
NC=nc.openbsd
T=180     # per-process bound, seconds
CTO=5000  # RSOCK_CONNECT_TIMEOUT_MS: the default 500 ms is too short under TCG
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
DATA=$T_WORK/data.bin
make_random "$DATA" 16
SIZE=$(stat -c %s "$DATA")
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)

# rs NAME: sets RS to an `rsock run` command line counting into $CELL_DIR/NAME, logging to
# $CELL_DIR/NAME.log (options and `--` PROGRAM follow).
rs() {
    RS=(env RSOCK_STATS_DIR="$CELL_DIR/$1" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$CTO
        "$T_BIN" run --log "$CELL_DIR/$1.log")
}

# rdma_listening PORT: an rdma_cm listener exists on PORT (dual listen).
rdma_listening() { rdma resource show cm_id 2>/dev/null | grep -qE "state LISTEN .*src-addr [^ ]*:$1( |\$)"; }

# qps_released: no RC QP is left once a cell's programs are gone (the next suite in the same
# boot counts them).
qps_released() {
    wait_qp_count 0 30 RC || fail "$(rdma_qp_count RC) RC QP(s) left 30 s after the cell's programs ended"
}

# count_in FILE PATTERN: lines of FILE matching the extended regex PATTERN.
count_in() { grep -cE -- "$2" "$1" 2>/dev/null || true; }

# ---- the rules file: one port to kernel TCP, one to RDMA ---------------------------------------

cell_rules_port_split() {
    cat > rules.conf <<EOF
# product.sh: port $PORT stays on kernel TCP, port $PORT2 goes over RDMA
tcp    port=$PORT
this line is malformed
rdma   port=$PORT2 ring=512K
EOF
    "$T_BIN" rules rules.conf > rules.out 2>&1
    grep -q 'line 3: unknown action "this"' rules.out || fail "rsock rules did not report line 3: $(paste -sd'|' rules.out)"
    rxe_counters_snapshot rxe.before
    rs srv1; bg srv1 $T "${RS[@]}" --config rules.conf -- $NC -l "$A" "$PORT"
    rs srv2; bg srv2 $T "${RS[@]}" --log-level debug --config rules.conf -- $NC -l "$A" "$PORT2"
    wait_listen "$PORT" 60 srv1 || fail "server 1 did not listen on $PORT"
    wait_listen "$PORT2" 60 srv2 || fail "server 2 did not listen on $PORT2"
    wait_rdma_listen "$PORT2" 60 || fail "no rdma_cm listener on $PORT2 (rule: rdma)"
    ! rdma_listening "$PORT" || fail "an rdma_cm listener on $PORT although its rule says tcp"
    rs cli
    bg_in cli1 $T "$DATA" "${RS[@]}" --config rules.conf -- $NC -N "$A" "$PORT"
    expect_status cli1 0
    bg_in cli2 $T "$DATA" "${RS[@]}" --config rules.conf -- $NC -N "$A" "$PORT2"
    expect_status cli2 0
    expect_status srv1 0
    expect_status srv2 0
    rxe_counters_delta rxe.before > rxe.delta
    echo "# rxe0 deltas: $(paste -sd' ' rxe.delta)"
    soft expect_same_file "$DATA" srv1.out "port $PORT (tcp)"
    soft expect_same_file "$DATA" srv2.out "port $PORT2 (rdma)"
    soft expect_stats "$CELL_DIR/cli" cli -D SIZE="$SIZE" 'nproc==2' 'conns.tcp==1' 'conns.rdma==1' \
        'fallback.rule==1' 'sum(fallback.__dict__.values())==1' 'tx.tcp==SIZE' 'tx.rdma==SIZE' 'conns.passthrough==0'
    soft expect_stats "$CELL_DIR/srv1" srv1 -D SIZE="$SIZE" 'nproc==1' 'conns.tcp==1' 'conns.rdma==0' 'rx.tcp==SIZE'
    soft expect_stats "$CELL_DIR/srv2" srv2 -D SIZE="$SIZE" 'nproc==1' 'conns.rdma==1' 'conns.tcp==0' 'rx.rdma==SIZE'
    local sent want=$((SIZE / MTU))
    sent=$(awk '$1 == "sent_pkts" { print $2 }' rxe.delta)
    [ "${sent:-0}" -ge "$want" ] || fail "rxe0 sent ${sent:-0} packets, want >= $want for $SIZE bytes over RDMA"
    # The malformed line is logged once per process, with its number.
    local f n
    for f in srv1 srv2; do
        n=$(count_in "$f.log" 'rules.conf line 3: unknown action')
        [ "$n" -eq 1 ] || fail "$f.log: the bad line logged $n times, want 1: $(grep -m2 'line 3' "$f.log" | paste -sd'|')"
    done
    # The rule's ring=512K is what the accepted connection's ring grew to under the stream
    # (it starts at RSOCK_BUF_START).
    grep -q 'ring grew to 524288$' srv2.log || fail "srv2.log: the ring did not grow to the rule's 512K: $(grep -m1 -e 'ring grew' -e 'accepted, ring' srv2.log)"
    n=$(count_in cli.log 'rules.conf line 3: unknown action')
    [ "$n" -eq 2 ] || fail "cli.log (2 processes): the bad line logged $n times, want 2"
    qps_released
}

# ---- rsock run --no-rdma: tracked, never tries RDMA -------------------------------------------

cell_run_no_rdma() {
    rs srv; bg srv $T "${RS[@]}" -- $NC -l "$A" "$PORT"
    wait_listen "$PORT" 60 srv || fail "server did not listen"
    wait_rdma_listen "$PORT" 60 || fail "the server (no rules) does not dual-listen on $PORT"
    rs cli; bg_in cli $T "$DATA" "${RS[@]}" --no-rdma --log-level debug -- $NC -N "$A" "$PORT"
    expect_status cli 0
    expect_status srv 0
    soft expect_same_file "$DATA" srv.out
    soft expect_stats "$CELL_DIR/cli" cli -D SIZE="$SIZE" 'nproc==1' 'conns.tcp==1' 'conns.rdma==0' \
        'fallback.rule==1' 'tx.tcp==SIZE'
    soft expect_stats "$CELL_DIR/srv" srv -D SIZE="$SIZE" 'conns.tcp==1' 'fallback.peer_tcp==1' 'rx.tcp==SIZE'
    grep -q 'over kernel TCP (rule: RSOCK_RDMA=0)' cli.log || fail "cli.log has no 'over kernel TCP (rule: RSOCK_RDMA=0)' line (--log-level debug)"
    qps_released
}

# ---- rsock stat --watch ------------------------------------------------------------------------

cell_stat_watch() {
    rs srv; bg srv $T "${RS[@]}" -- $NC -l "$A" "$PORT"
    wait_listen "$PORT" 60 srv || fail "server did not listen"
    wait_rdma_listen "$PORT" 60 || fail "no rdma_cm listener"
    # 12 MiB in 256 KiB steps every 0.2 s, through a fifo: about 10 s of steady traffic to watch.
    mkfifo slow.fifo
    python3 -c 'import time
out = open("slow.fifo", "wb")
for _ in range(48):
    out.write(b"x" * 262144); out.flush(); time.sleep(0.2)' &
    rs cli; bg_in cli $T slow.fifo "${RS[@]}" -- $NC -N "$A" "$PORT"
    wait_cond 60 '[ -n "$(ls "$CELL_DIR/cli" 2>/dev/null)" ]' || fail "no stats file from the client"
    sleep 1
    "$T_BIN" stat --dir "$CELL_DIR/cli" --watch 0.5 --count 6 > watch.out 2> watch.err || fail "rsock stat --watch failed: $(cat watch.err)"
    script -qfec "$T_BIN stat --dir $CELL_DIR/cli --watch 0.2 --count 2" /dev/null > tty.out 2>&1 ||
        fail "rsock stat --watch on a terminal failed: $(head -c 300 tty.out)"
    expect_status cli 0
    expect_status srv 0
    [ "$(stat -c %s srv.out)" -eq $((48 * 262144)) ] || fail "server got $(stat -c %s srv.out) bytes, want $((48 * 262144))"
    sed 's/^/#   /' watch.out | tail -n 8
    local frames rate_lines conn_lines
    frames=$(count_in watch.out '^--- rsock stat --watch 0.5s ')
    [ "$frames" -eq 6 ] || fail "$frames frames in watch.out, want 6"
    ! grep -q $'\x1b' watch.out || fail "escape sequences in --watch output to a file"
    rate_lines=$(count_in watch.out '^  rdma +1 conns +[0-9.]+ (KiB|MiB)/s ')
    [ "$rate_lines" -ge 3 ] || fail "only $rate_lines frames show a non-zero rdma tx rate for the process, want >= 3"
    conn_lines=$(count_in watch.out "^    fd [0-9]+ +rdma +$A:[0-9]+ -> $A:$PORT +tx [0-9.]+ (KiB|MiB)/s rx ")
    [ "$conn_lines" -ge 3 ] || fail "only $conn_lines frames show the connection's rdma tx rate, want >= 3"
    grep -q $'\x1b\\[H' tty.out || fail "no cursor-home sequence on a terminal: $(head -c 200 tty.out | od -c | head -3)"
    qps_released
}

# ---- rsock stat and another user's processes --------------------------------------------------

cell_stat_other_user() {
    # Root's processes, counting into root's default directory /dev/shm/rsock-0.
    bg srv $T env RSOCK_CONNECT_TIMEOUT_MS=$CTO "$T_BIN" run -- $NC -l "$A" "$PORT"
    wait_listen "$PORT" 60 srv || fail "server did not listen"
    wait_rdma_listen "$PORT" 60 || fail "no rdma_cm listener"
    # The client holds its connection open (stdin from a fifo nobody closes) until stopped.
    mkfifo hold.fifo
    sleep 300 > hold.fifo &
    local holder=$!
    bg_in cli $T hold.fifo env RSOCK_CONNECT_TIMEOUT_MS=$CTO "$T_BIN" run -- $NC "$A" "$PORT"
    local pid
    wait_until 60 pgrep -f "^$NC -l $A $PORT\$" || fail "no server process"
    pid=$(pgrep -f "^$NC -l $A $PORT\$" | head -n1)
    wait_until 60 test -e "/dev/shm/rsock-0/$pid.stats" || fail "no /dev/shm/rsock-0/$pid.stats"
    wait_cond 60 "\"$T_BIN\" stat $pid | grep -q '^  rdma *1 '" || fail "root: rsock stat $pid shows no rdma connection: $("$T_BIN" stat "$pid" 2>&1 | paste -sd'|')"
    echo "# root: $("$T_BIN" stat "$pid" | head -n1)"
    local rc=0
    "${NOBODY[@]}" "$T_BIN" stat --dir /dev/shm/rsock-0 > dir.out 2> dir.err || rc=$?
    echo "# nobody, --dir: exit $rc: $(cat dir.err)"
    [ "$rc" -eq 1 ] || fail "nobody: rsock stat --dir /dev/shm/rsock-0 exited $rc, want 1"
    grep -q 'permission denied: it belongs to user root (uid 0)' dir.err || fail "nobody, --dir: unclear message: $(cat dir.err)"
    rc=0
    "${NOBODY[@]}" "$T_BIN" stat "$pid" > pid.out 2> pid.err || rc=$?
    echo "# nobody, pid: exit $rc: $(cat pid.err)"
    [ "$rc" -eq 1 ] || fail "nobody: rsock stat $pid exited $rc, want 1"
    grep -q "pid $pid: runs as user root (uid 0); its stats (/dev/shm/rsock-0/$pid.stats) are readable only by that user or root" pid.err ||
        fail "nobody, pid: unclear message: $(cat pid.err)"
    [ ! -s pid.out ] || fail "nobody, pid: printed counters it should not have read: $(head -c 200 pid.out)"
    rc=0
    "${NOBODY[@]}" "$T_BIN" stat > own.out 2>&1 || rc=$?
    [ "$rc" -eq 0 ] && grep -q '^no rsock processes in /dev/shm/rsock-65534' own.out ||
        fail "nobody, own processes: exit $rc: $(cat own.out)"
    bg_stop cli
    bg_stop srv
    kill "$holder" 2>/dev/null
    "$T_BIN" stat --gc > /dev/null  # the stopped processes' files in /dev/shm/rsock-0
    qps_released
}

# ---- rsock check ---------------------------------------------------------------------------------

# `rsock check`: this host's device and memlock, then HOST:PORT of a server under rsock (the
# probe's connection goes over RDMA) and of a plain server (kernel TCP, RDMA rejected).
cell_check() {
    "$T_BIN" check > host.out 2>&1 || fail "rsock check (no peer): status $?: $(cat host.out)"
    grep -qE '^ok +device +rxe0 port 1: ACTIVE' host.out || fail "no ACTIVE rxe0 line: $(cat host.out)"
    grep -qE '^ok +memlock +unlimited' host.out || fail "no memlock line: $(cat host.out)"
    rs srv; bg srv $T "${RS[@]}" -- $NC -l "$A" "$PORT"
    wait_listen "$PORT" 60 srv || fail "server did not listen"
    wait_rdma_listen "$PORT" 60 || fail "no rdma_cm listener"
    env RSOCK_CONNECT_TIMEOUT_MS=$CTO "$T_BIN" check "$A:$PORT" > shimmed.out 2>&1 ||
        fail "rsock check against the shimmed server: status $?: $(cat shimmed.out)"
    grep -qE "^ok +route +$A: rdma_cm resolved" shimmed.out || fail "no route line: $(cat shimmed.out)"
    grep -qE "^ok +server +$A:$PORT: connected over RDMA" shimmed.out || fail "not over RDMA: $(cat shimmed.out)"
    expect_status srv 0
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma==1' 'conns.tcp==0'
    local plain=$((PORT + 1))
    bg plain $T $NC -l "$A" "$plain"
    wait_listen "$plain" 60 plain || fail "plain server did not listen"
    env RSOCK_CONNECT_TIMEOUT_MS=$CTO "$T_BIN" check "$A:$plain" > plain.out 2>&1 ||
        fail "rsock check against a plain server: status $? (warnings only expected): $(cat plain.out)"
    grep -qE "^warn +server +$A:$plain: connected over kernel TCP; RDMA: rejected: rdma_cm REJECTED" plain.out ||
        fail "plain server not reported as rejected: $(cat plain.out)"
    expect_status plain 0
    qps_released
}

# ---- what put each connection on its path, and a log level raised in a running process ----------

# A client under rsock holds a connection to a plain server on the RDMA address: RDMA is
# rejected (no rdma_cm listener) and `rsock stat` says so with the rdma_cm event. A server
# under rsock started without a log gets one from `rsock log`, and logs the next accept there.
cell_stat_causes() {
    bg plain $T $NC -l "$A" "$PORT"
    wait_listen "$PORT" 60 plain || fail "plain server did not listen"
    mkfifo hold.fifo
    sleep 300 > hold.fifo &
    local holder=$!
    rs cli; bg_in cli $T hold.fifo "${RS[@]}" -- $NC "$A" "$PORT"
    wait_cond 60 "\"$T_BIN\" stat --dir \"$CELL_DIR/cli\" --json | grep -q '\"path\":\"tcp\"'" ||
        fail "no tcp connection in the client's stats: $("$T_BIN" stat --dir "$CELL_DIR/cli" --json)"
    "$T_BIN" stat --dir "$CELL_DIR/cli" > cli.stat
    "$T_BIN" stat --dir "$CELL_DIR/cli" --json > cli.json
    sed 's/^/#   /' cli.stat | grep ' fd ' | head -n 3
    grep -qE '"reason":"rejected","detail":"rdma_cm REJECTED \(no RDMA listener[^"]*\), ECONNREFUSED"' cli.json ||
        fail "the connection's cause is not rdma_cm REJECTED: $(cat cli.json)"
    grep -qE "^  fd [0-9]+ +tcp +$A:[0-9]+ -> $A:$PORT .*rejected: rdma_cm REJECTED" cli.stat ||
        fail "rsock stat does not show the cause: $(cat cli.stat)"
    bg_stop cli
    bg_stop plain
    kill "$holder" 2>/dev/null

    # No --log: the server logs nowhere until asked.
    local dir=$CELL_DIR/srv
    bg srv $T env RSOCK_STATS_DIR="$dir" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$CTO \
        "$T_BIN" run -- $NC -l "$A" "$PORT2"
    wait_listen "$PORT2" 60 srv || fail "server did not listen"
    wait_rdma_listen "$PORT2" 60 || fail "no rdma_cm listener"
    local pid
    pid=$(pgrep -f "^$NC -l $A $PORT2\$" | head -n1)
    [ -n "$pid" ] || fail "no server process"
    "$T_BIN" log --dir "$dir" "$pid" > before.out 2>&1 || fail "rsock log PID: status $?: $(cat before.out)"
    grep -q "log off" before.out || fail "a server without RSOCK_LOG does not say its log is off: $(cat before.out)"
    "$T_BIN" log --dir "$dir" "$pid" debug > log.out 2>&1 || fail "rsock log PID debug: status $?: $(cat log.out)"
    echo "# $(cat log.out)"
    grep -q "debug to $dir/$pid.log" log.out || fail "rsock log did not say where the log goes: $(cat log.out)"
    rs cli2; bg_in cli2 $T "$DATA" "${RS[@]}" -- $NC -N "$A" "$PORT2"
    expect_status cli2 0
    expect_status srv 0
    soft expect_same_file "$DATA" srv.out
    soft expect_stats "$dir" srv 'conns.rdma==1'
    grep -q 'rsock log: level OFF -> DEBUG' "$dir/$pid.log" || fail "no level change line in $dir/$pid.log: $(head -c 400 "$dir/$pid.log")"
    grep -qE 'DEBUG .*(accept|RDMA)' "$dir/$pid.log" || fail "no debug line about the accept in $dir/$pid.log: $(head -c 600 "$dir/$pid.log")"
    qps_released
}

# A process that made its stats file as root and then became nobody (as a server's worker
# does) can still be asked for a log level: the file is root's and the process's; but it
# cannot open a log in root's directory, and `rsock log` says so instead of claiming a log.
cell_log_after_setuid() {
    local dir=$CELL_DIR/st
    bg drop $T env RSOCK_STATS_DIR="$dir" RSOCK_STATS_KEEP=1 "$T_BIN" run -- python3 -c '
import os, socket, time
socket.socket().close()          # the stats file, made as root
os.setgid(65534); os.setuid(65534)
for _ in range(3000):            # a socket every 20 ms: the shim looks at each
    socket.socket().close(); time.sleep(0.02)'
    wait_cond 30 "ls '$dir'/*.stats > /dev/null 2>&1" || fail "no stats file in $dir"
    local pid
    pid=$(basename "$(ls "$dir"/*.stats | head -n1)" .stats)
    wait_cond 30 "grep -q '^Uid:.65534' /proc/$pid/status" || fail "pid $pid did not become nobody"
    local rc=0
    "$T_BIN" log --dir "$dir" "$pid" debug > log.out 2>&1 || rc=$?
    echo "# exit $rc: $(cat log.out)"
    [ "$rc" -eq 1 ] || fail "rsock log exited $rc, want 1: $(cat log.out)"
    grep -q "cannot open its log file" log.out || fail "rsock log does not say the log cannot be opened: $(cat log.out)"
    "$T_BIN" stat --dir "$dir" --json | grep -q '"log":{"level":"debug","to":"unwritable"}' ||
        fail "stat does not show the unwritable log: $("$T_BIN" stat --dir "$dir" --json)"
    [ ! -e "$dir/$pid.log" ] || fail "a log file appeared although the process is nobody"
    bg_stop drop
}

# The echo server of the two cells below: listens as root on ADDR PORT, writes its pid to
# PIDFILE, serves BEFORE connections, drops root (setgroups, setgid, setuid: three calls, as
# daemons do), then serves AFTER connections; each one echoed whole after the client's EOF,
# and kept open (for `rsock stat`).
SETUID_SERVER='
import os, socket, sys
addr, port, pidfile, before, after = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((addr, port)); l.listen(16)
kept = []
def serve():
    c, _ = l.accept()
    kept.append(c)
    data = b""
    while True:
        b = c.recv(65536)
        if not b: break
        data += b
    c.sendall(data); c.shutdown(socket.SHUT_WR)
open(pidfile, "w").write(str(os.getpid()))
for _ in range(before): serve()
os.setgroups([]); os.setgid(65534); os.setuid(65534)
for _ in range(after): serve()
import time; time.sleep(300)'

# A daemon that listens as root and drops root before its first connection (lighttpd,
# stunnel, tinyproxy, memcached -u) abandons the engine it listened with (the kernel refuses
# its writes to the new credentials) and listens on RDMA again with a new one: the rsock
# client's connection goes over RDMA, its bytes intact, and the listener says rdma+tcp.
cell_listener_after_setuid() {
    rs srv; bg srv $T "${RS[@]}" -- python3 -c "$SETUID_SERVER" "$A" "$PORT" "$CELL_DIR/srv.pid" 0 1
    wait_listen "$PORT" 60 srv || fail "server did not listen"
    wait_until 30 test -s srv.pid || fail "no pid file"
    wait_cond 60 "grep -q '^Uid:.65534' /proc/$(cat srv.pid)/status" || fail "the server did not become nobody"
    # It listens on rdma_cm again at its next call (its accept).
    wait_until 30 rdma_listening "$PORT" || fail "no rdma_cm listener on $PORT after the credential change"
    rs cli; bg_in cli $T "$DATA" "${RS[@]}" -- $NC -N "$A" "$PORT"
    expect_status cli 0
    soft expect_same_file "$DATA" cli.out
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==1' 'conns.tcp==0'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma==1' 'conns.tcp==0'
    "$T_BIN" stat --dir "$CELL_DIR/srv" > srv.stat
    sed 's/^/#   /' srv.stat | grep -E 'listening|fd '
    grep -qE "listening on $A:$PORT  rdma\+tcp" srv.stat ||
        fail "the listener is not on RDMA again: $(cat srv.stat)"
    grep -q "listening on $A:$PORT over RDMA again, with the new credentials" srv.log ||
        fail "the log does not say the listener is on RDMA again"
    bg_stop srv
    qps_released
}

# The same daemon on a privileged port: rdma_cm, like TCP, lets only CAP_NET_BIND_SERVICE
# listen there, so the listener stays on kernel TCP after the drop (the log says why) and
# the rsock client's connection goes over kernel TCP, its bytes intact.
cell_listener_after_setuid_privileged() {
    local port=$((900 + RANDOM % 100))
    rs srv; bg srv $T "${RS[@]}" -- python3 -c "$SETUID_SERVER" "$A" "$port" "$CELL_DIR/srv.pid" 0 1
    wait_listen "$port" 60 srv || fail "server did not listen"
    wait_until 30 test -s srv.pid || fail "no pid file"
    wait_cond 60 "grep -q '^Uid:.65534' /proc/$(cat srv.pid)/status" || fail "the server did not become nobody"
    rs cli; bg_in cli $T "$DATA" "${RS[@]}" -- $NC -N "$A" "$port"
    expect_status cli 0
    soft expect_same_file "$DATA" cli.out
    soft expect_stats "$CELL_DIR/cli" cli 'conns.tcp==1' 'conns.rdma==0'
    grep -q "port $port is privileged, and rdma_cm refuses it" srv.log ||
        fail "the log does not say why the listener stays on kernel TCP: $(grep -i 'tcp only' srv.log)"
    "$T_BIN" stat --dir "$CELL_DIR/srv" > srv.stat
    grep -qE "listening on $A:$port  tcp only \(rdma_unavailable: the process changed its credentials\)" srv.stat ||
        fail "the listener does not say it lost RDMA: $(cat srv.stat)"
    bg_stop srv
    qps_released
}

# A server that changes its credentials with a connection of its engine still open cannot
# abandon that engine: the listener loses its rdma_cm side, `rsock stat` says so for it and
# for what it accepts, and the next rsock client's connection goes over kernel TCP, its
# bytes intact.
cell_listener_after_setuid_in_use() {
    rs srv; bg srv $T "${RS[@]}" -- python3 -c "$SETUID_SERVER" "$A" "$PORT" "$CELL_DIR/srv.pid" 1 1
    wait_listen "$PORT" 60 srv || fail "server did not listen"
    wait_until 30 test -s srv.pid || fail "no pid file"
    rs cli; bg_in cli $T "$DATA" "${RS[@]}" -- $NC -N "$A" "$PORT"
    expect_status cli 0
    soft expect_same_file "$DATA" cli.out
    wait_cond 60 "grep -q '^Uid:.65534' /proc/$(cat srv.pid)/status" || fail "the server did not become nobody"
    rs cli2; bg_in cli2 $T "$DATA" "${RS[@]}" -- $NC -N "$A" "$PORT"
    expect_status cli2 0
    soft expect_same_file "$DATA" cli2.out
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==1'
    soft expect_stats "$CELL_DIR/cli2" cli2 'conns.tcp==1' 'conns.rdma==0'
    "$T_BIN" stat --dir "$CELL_DIR/srv" > srv.stat
    sed 's/^/#   /' srv.stat | grep -E 'listening|fd '
    grep -qE "listening on $A:$PORT  tcp only \(rdma_unavailable: the process changed its credentials\)" srv.stat ||
        fail "the listener does not say it lost RDMA: $(cat srv.stat)"
    grep -qE "^  fd [0-9]+ +tcp .*\(rdma_unavailable: the process changed its credentials\)" srv.stat ||
        fail "the accepted connection does not say why it is on TCP: $(cat srv.stat)"
    bg_stop srv
    qps_released
}

# ---- run -----------------------------------------------------------------------------------------

CELLS=(rules_port_split run_no_rdma stat_watch stat_other_user check stat_causes log_after_setuid listener_after_setuid listener_after_setuid_privileged listener_after_setuid_in_use)
selected() {
    local p
    [ -z "$PATTERN" ] && return 0
    for p in ${PATTERN//,/ }; do [[ $1 == *$p* ]] && return 0; done
    return 1
}
for c in "${CELLS[@]}"; do
    selected "$c" || continue
    before=$T_FAIL
    t_cell "$c" "cell_$c"
    if [ "$T_FAIL" -gt "$before" ]; then
        tail -n 15 "$T_WORK/$c/cell.log" | sed 's/^/    | /'
    else
        grep '^# ' "$T_WORK/$c/cell.log" | sed 's/^/    /'
    fi
done
t_summary
