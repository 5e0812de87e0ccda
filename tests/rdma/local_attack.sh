#!/usr/bin/env bash
# Local attackers against rsock's control sockets (issue #21), in the Soft-RoCE guest. Every
# rsock engine listens on an abstract AF_UNIX name (`@rsock.<pid>.<nonce>`, visible in
# /proc/net/unix) where processes that hold one of its sockets ask for relays, accepts and
# take-overs. tests/programs/local_attacker.py finds those names and, without holding any
# of the victim's sockets, replays requests for guessed tokens, sends malformed messages,
# and floods each engine with idle connections (half of them carrying 4 fds of /dev/null).
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh -- tests/rdma/local_attack.sh [PATTERN[,PATTERN...]]
#
# Each cell asserts, for an attacker running as nobody and then as root without the fds:
#   (a) the attacker got no fd and no answer but a refusal (its exit status);
#   (b) the server's fd count grows by at most 8 when the flood opens (the connections of
#       one uid that may wait for their request, src/engine/ipc), and the attacker's end
#       leaves none behind (after it, no more fds than before it ended);
#   (c) fresh RDMA clients are served while the flood is held, each within SERVICE_S (the
#       old helper blocked up to 1 s per idle connection: 67 of them took 14 s);
#   (d) their bytes come back intact (sha256) and every connection is on RDMA at both ends.
# Cells: local_attack_echo (a root echo server: one process owns its streams),
# local_attack_prefork (a prefork server: workers take every connection over from the
# master, so each client needs the master's control socket while it is flooded).
# Cell local_attack_squat: a listener passed to an unrelated worker (tests/rdma/fork/
# pass_fds.py lworker/lsender), whose sender then exits; the attacker, as nobody, binds the
# sender's control-socket name as soon as it is free and answers the worker's accept with a
# forged kernel TCP connection of its own. Asserts: the squatter was called; the worker
# believed none of it (it checks the answering pid), took the listener over and served 3
# RDMA clients intact, every connection it served coming from the clients' address.
# Prints "PASS cell (Ns)" / "FAIL cell: why", then "N passed, N failed"; exit 1 on failure.

set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need nc.openbsd python3 setpriv pgrep timeout sha256sum rdma ibv_devinfo
PATTERN=${1:-}
MUT=0
A=$RDMA_VM_ADDR
NC=nc.openbsd
EX=$T_EXAMPLES
ATK=$T_ROOT/tests/programs/local_attacker.py
T=240     # per-process bound, seconds
CTO=5000  # RSOCK_CONNECT_TIMEOUT_MS: the default 500 ms is too short under TCG
SERVICE_S=5
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/local-attack-$RUN_ID
ulimit -l unlimited 2>/dev/null || true
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
for x in echo_server prefork_server fork_client; do
    [ -x "$EX/$x" ] || { echo "missing $EX/$x (cargo build --release --examples)" >&2; exit 2; }
done
chmod 755 "$T_WORK"
DATA=$T_WORK/data.bin
make_random "$DATA" 1
SIZE=$(stat -c %s "$DATA")

fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }

# attack AS SERVER_PID CLIENT_FN: runs the attacker as user AS (nobody or root) with its
# flood held while CLIENT_FN serves fresh clients, and checks (a)-(c).
attack() {
    local as=$1 spid=$2 client=$3 before during after rc=0
    local ready=$CELL_DIR/flood.$as
    before=$(fd_count "$spid")
    if [ "$as" = root ]; then
        bg "atk_$as" 120 python3 "$ATK" --ready "$ready" --hold 10
    else
        bg "atk_$as" 120 setpriv --reuid=65534 --regid=65534 --clear-groups python3 "$ATK" --ready "$ready" --hold 10
    fi
    wait_until 90 test -e "$ready" || fail "attacker ($as) never opened its flood: $(tail -c 300 "atk_$as.err" | paste -sd' ')"
    during=$(fd_count "$spid")
    "$client" "$as"
    mid=$(fd_count "$spid")
    bg_wait "atk_$as" || rc=$?
    sleep 1
    after=$(fd_count "$spid")
    sed 's/^/#   /' "atk_$as.out" | grep -v '^#   BREACH' | tail -n 3
    echo "# server fds: $before before the flood, $during when it opened, $mid after the clients, $after after the attacker ($as)"
    [ "$rc" -eq 0 ] || soft fail "attacker ($as) exited $rc: $(grep -m3 BREACH "atk_$as.out" | paste -sd'|') $(tail -c 200 "atk_$as.err")"
    grep -q 'names=[1-9].* requests=[1-9]' "atk_$as.out" || soft fail "attacker ($as) found no engine to attack: $(tail -n1 "atk_$as.out")"
    grep -q 'flood_held=[1-9]' "atk_$as.out" || soft fail "attacker ($as) held no flood connection"
    [ "$during" -le $((before + 8)) ] || soft fail "server fds grew from $before to $during under the flood ($as)"
    [ "$after" -le "$mid" ] || soft fail "server fds grew from $mid to $after when the attacker ended ($as)"
}

# timed NAME SECS CMD...: runs CMD in the foreground; fails the cell if it took longer than
# SERVICE_S or exited non-zero.
timed() {
    local name=$1; shift
    local t0 t1 rc=0
    t0=$(date +%s%N)
    _cmd "$@"
    timeout -k 2 60 "${T_CMD[@]}" > "$CELL_DIR/$name.out" 2> "$CELL_DIR/$name.err" < "${TIMED_IN:-/dev/null}" || rc=$?
    t1=$(date +%s%N)
    local ms=$(((t1 - t0) / 1000000))
    echo "# $name served in $ms ms"
    [ "$rc" -eq 0 ] || soft fail "$name exited $rc: $(tail -c 200 "$CELL_DIR/$name.err" | paste -sd' ')"
    [ "$ms" -le $((SERVICE_S * 1000)) ] || soft fail "$name took $ms ms while the flood was held, want <= ${SERVICE_S}s"
}

echo_clients() {
    local i
    for i in 1 2 3; do
        TIMED_IN=$DATA timed "c_$1_$i" shimmed "$CELL_DIR/cli" $NC -N "$A" "$PORT"
        soft expect_same_file "$DATA" "c_$1_$i.out" "client $1 $i"
    done
}

cell_local_attack_echo() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    local spid
    spid=$(pgrep -P "$(bg_pid srv)" | head -n1)
    chmod 777 "$CELL_DIR"  # the attacker, as nobody, says when its flood is open
    # One connection first: the engine and a stream exist before the attack.
    TIMED_IN=$DATA timed c_first shimmed "$CELL_DIR/cli" $NC -N "$A" "$PORT"
    attack nobody "$spid" echo_clients
    attack root "$spid" echo_clients
    bg_alive srv || fail "the echo server died: $(tail -c 300 srv.err | paste -sd' ')"
    bg_stop srv
    # Each client's connection lives half a second: the QP sampler may miss them all; the
    # packets and both ends' counters say RDMA.
    soft rdma_end "$((7 * SIZE))" 0
    soft expect_rdma cli 7 -D B=$((7 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma==7' 'conns.tcp==0'
    expect_qps_released
}

prefork_clients() {
    timed "c_$1" shimmed "$CELL_DIR/cli" "$EX/fork_client" "$A:$PORT" --conns 3 --parallel 3 \
        --bytes "$SIZE" --timeout 60
}

cell_local_attack_prefork() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/prefork_server" "$A:$PORT" 2 --log "$CELL_DIR/events.log" \
        --pidfile "$CELL_DIR/srv.pid"
    wait_dual srv
    wait_until 30 test -s srv.pid || fail "no pid file"
    local main
    main=$(cat srv.pid)
    chmod 777 "$CELL_DIR"
    attack nobody "$main" prefork_clients
    attack root "$main" prefork_clients
    kill -TERM "$main" 2>/dev/null
    expect_status srv 0
    local e
    e=$(grep -m3 '^error' events.log | paste -sd'|')
    [ -z "$e" ] || soft fail "server errors: $e"
    soft rdma_end "$((6 * SIZE))" 0
    soft expect_rdma cli 6
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma==6' 'conns.tcp==0'
    expect_qps_released
}

cell_local_attack_squat() {
    local fk=$T_ROOT/tests/rdma/fork
    rdma_begin
    chmod 777 "$CELL_DIR"
    bg worker $T shimmed "$CELL_DIR/srv" python3 "$fk/pass_fds.py" lworker "$CELL_DIR/ch.sock" 3 \
        "$CELL_DIR/events.log" "$CELL_DIR/gate"
    wait_until 30 test -S "$CELL_DIR/ch.sock" || fail "the worker did not listen: $(tail -c 300 worker.err)"
    # The sender stays until the attacker knows its engine's name (under load, the attacker
    # once started after the sender had gone, and had nothing to squat).
    bg snd $T shimmed "$CELL_DIR/srv" python3 "$fk/pass_fds.py" lsender "$A" "$PORT" "$CELL_DIR/ch.sock" \
        "$CELL_DIR/events.log" 3 "$CELL_DIR/found"
    wait_until 60 grep -q '^received ' events.log || fail "the worker got no listener: $(tail -c 300 worker.err | paste -sd' ')"
    local spid
    spid=$(awk '/^listen /{ sub("pid=", "", $2); print $2; exit }' events.log)
    wait_until 30 grep -q "@rsock\.$spid\." /proc/net/unix || fail "the sender's engine has no control socket"
    bg atk 120 setpriv --reuid=65534 --regid=65534 --clear-groups python3 "$ATK" --squat "$spid" --hold 15 \
        --ready "$CELL_DIR/squatting" --found "$CELL_DIR/found"
    bg_wait snd || fail "sender: $(tail -c 300 snd.err | paste -sd' ')"
    wait_until 60 test -e squatting || fail "the attacker could not squat: $(tail -c 300 atk.out atk.err | paste -sd' ')"
    touch gate  # the worker accepts now: its first call reaches the squatter
    wait_until 60 grep -q 'taking the listener over' srv.log ||
        fail "the worker did not take the listener over: $(tail -c 400 srv.log | paste -sd' ')"
    wait_rdma_listen "$PORT" 60 || fail "the worker does not serve RDMA on the listener it took over"
    local i
    for i in 1 2 3; do
        bg "c$i" $T shimmed "$CELL_DIR/cli" python3 "$fk/pass_fds.py" client "$A" "$PORT" "$DATA" "$CELL_DIR/got$i" 200
    done
    for i in 1 2 3; do
        bg_wait "c$i" || soft fail "client $i: $(tail -c 300 "c$i.err" | paste -sd' ')"
        soft expect_same_file "$DATA" "got$i" "client $i"
    done
    bg_wait worker || soft fail "worker: $(tail -c 300 worker.err | paste -sd' ')"
    bg_wait atk || soft fail "the attacker: $(tail -c 300 atk.err | paste -sd' ')"
    sed 's/^/#   /' atk.out
    grep -q 'callers=[1-9]' atk.out || soft fail "the squatter was never called: $(tail -n1 atk.out)"
    [ "$(grep -c "^served .* bytes=$SIZE" events.log)" -eq 3 ] ||
        soft fail "the worker did not echo 3 whole streams: $(grep '^served' events.log | paste -sd'|')"
    [ "$(grep -c "^serve .* peer=('$A'," events.log)" -eq 3 ] ||
        soft fail "the worker served a connection not from the clients: $(grep '^serve ' events.log | paste -sd'|')"
    soft expect_rdma cli 3 -D B=$((3 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma>=3' 'conns.tcp==0'
    soft rdma_end "$((3 * SIZE))" 0
    expect_qps_released
}

res_summary > "$T_WORK/res.start"
for c in local_attack_echo local_attack_prefork local_attack_squat; do
    selected "$c" || continue
    run_cell "$c"
done
run_cell leaks
t_summary
