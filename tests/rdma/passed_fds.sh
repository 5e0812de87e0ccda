#!/usr/bin/env bash
# RDMA streams passed between unrelated processes with SCM_RIGHTS (issue #20), both ends
# under librsock.so in the Soft-RoCE guest. The process that receives a stream's fd takes
# it over (its QP moves there) or has it relayed; the sender closing its copy ends nothing.
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh -- tests/rdma/passed_fds.sh [PATTERN[,PATTERN...]]
#
# Cells:
#   passed_acceptor_worker  a Python acceptor sends each accepted connection to a worker it
#                           did not fork (tests/rdma/fork/pass_fds.py) and closes its copy;
#                           3 clients, each pausing half-way with its connection open.
#   passed_plain_worker     the same with a worker that runs without the shim: the acceptor's
#                           shim sees it (the worker's memory map) and sends relay ends
#                           instead of the streams; it relays them.
#   passed_node_cluster     Node.js cluster, round-robin (its default: the primary accepts
#                           and sends each handle to a worker), 2 workers, 4 curl requests
#                           without keep-alive.
#   passed_systemd_activate `systemd-socket-activate` (standing for systemd, without the shim)
#                           listens and, on the first connection, execs a server that finds
#                           its listener on fd 3: the server adopts it as a dual listener of
#                           its own on its first accept; later clients use RDMA.
#   passed_systemd_accept   `systemd-socket-activate --accept` (inetd style) under the shim: it
#                           accepts, forks, and the child execs the server with the connection
#                           on fd 3: the new image takes it over on first use
#                           (RSOCK_PASSED_FDS).
#   passed_listener_held    a process sends its listener to an unrelated worker and closes
#                           its copy, staying alive: the worker accepts through it (the
#                           sender's engine still owns the rdma_cm listener) and takes each
#                           connection over.
#   passed_listener_reload  the same, but the sender exits once it passed the listener (a
#                           seamless reload's old process): the worker takes the listener over
#                           and serves RDMA on it itself.
#   passed_listener_queued  (opt-in: run it by naming it) the sender exits with 3 RDMA
#                           connections in its listener's queue, which the worker starts
#                           accepting only then: the sender hands the listener on (takes no
#                           more in, waits for its queue to be accepted through it) before
#                           it is gone. Passed 2 of 3 runs on 2026-11-25: in the third the
#                           sender exited while the worker's take-over of the last connection
#                           was still under way (its export found the owner gone) — not
#                           understood yet.
#   passed_exec_listener    a server that listens, then forks 2 children that exec a program
#                           with the listener on fd 3 and an environment cleaned of all but
#                           PATH (Postfix's master); it never accepts itself: the children
#                           accept through it (the shim puts itself back in their
#                           environment), 2 clients each.
#   passed_exec_taken       a fork-after-accept server whose child takes its connection over
#                           (reads the first byte), then execs a program with it on fd 3: the
#                           stream goes back to the parent, which relays it to the new image.
# Each asserts: the bytes (sha256), every connection on RDMA at both ends (the shims'
# counters; the servers' sides summed over their processes), the device's packets, and that
# QPs were owned by the worker processes (`rdma resource show qp`, sampled).
# Prints "PASS cell (Ns)" / "FAIL cell: why", then "N passed, N failed"; exit 1 on failure.

set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need python3 curl pgrep timeout sha256sum rdma ibv_devinfo
PATTERN=${1:-}
MUT=0
A=$RDMA_VM_ADDR
FK=$T_ROOT/tests/rdma/fork
T=240
CTO=5000
QP_SAMPLE_S=0.3
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/passed-fds-$RUN_ID
ulimit -l unlimited 2>/dev/null || true
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
DATA=$T_WORK/data.bin
make_random "$DATA" 2
SIZE=$(stat -c %s "$DATA")

# start_clients N PAUSE_MS: N shimmed clients (c1..cN) that each send DATA, pausing half-way.
start_clients() {
    local i
    for i in $(seq 1 "$1"); do
        bg "c$i" $T shimmed "$CELL_DIR/cli" python3 "$FK/pass_fds.py" client "$A" "$PORT" "$DATA" "$CELL_DIR/got$i" "$2"
    done
}

# check_clients N: each of c1..cN exited 0 and got DATA back.
check_clients() {
    local i
    for i in $(seq 1 "$1"); do
        bg_wait "c$i" || soft fail "client $i: $(tail -c 300 "c$i.err" | paste -sd' ')"
        soft expect_same_file "$DATA" "got$i" "client $i"
    done
}

# qps_of PID...: how many sampled RC QP lines belong to one of the processes.
qps_of() {
    local n=0 p
    for p in "$@"; do n=$((n + $(grep -c " tgid $p " qps.log 2>/dev/null || true))); done
    echo "$n"
}

# acceptor_cell shimmed|plain: the acceptor hands 3 connections to a worker it did not fork,
# the worker running with the shim (it takes each stream over) or without (the acceptor's
# shim sends relay ends, which it feeds).
acceptor_cell() {
    local with=$1
    rdma_begin
    if [ "$with" = shimmed ]; then
        bg worker $T shimmed "$CELL_DIR/srv" python3 "$FK/pass_fds.py" worker "$CELL_DIR/ch.sock" 3 "$CELL_DIR/events.log"
    else
        bg worker $T python3 "$FK/pass_fds.py" worker "$CELL_DIR/ch.sock" 3 "$CELL_DIR/events.log"
    fi
    wait_until 30 test -S "$CELL_DIR/ch.sock" || fail "the worker did not listen: $(tail -c 300 worker.err)"
    bg acc $T shimmed "$CELL_DIR/srv" python3 "$FK/pass_fds.py" acceptor "$A" "$PORT" "$CELL_DIR/ch.sock" 3 "$CELL_DIR/events.log"
    wait_dual acc
    start_clients 3 1500
    check_clients 3
    bg_wait acc || soft fail "acceptor: $(tail -c 300 acc.err | paste -sd' ')"
    bg_wait worker || soft fail "worker: $(tail -c 300 worker.err | paste -sd' ')"
    bg_stop qps
    local wpid apid
    wpid=$(awk '/^serve /{ sub("pid=", "", $2); print $2; exit }' events.log)
    apid=$(awk '/^listen /{ sub("pid=", "", $2); print $2; exit }' events.log)
    echo "# acceptor pid $apid, worker pid $wpid; sampled QPs: worker $(qps_of "$wpid"), acceptor $(qps_of "$apid")"
    grep -c "^served pid=$wpid .* bytes=$SIZE" events.log | grep -qx 3 ||
        soft fail "the worker did not echo 3 whole streams: $(grep '^served' events.log | paste -sd'|')"
    soft expect_rdma cli 3 -D B=$((3 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    if [ "$with" = shimmed ]; then
        [ "$(qps_of "$wpid")" -gt 0 ] || soft fail "no QP was ever the worker's: the streams were not taken over"
        soft expect_stats "$CELL_DIR/srv" srv -D B=$((3 * SIZE)) 'conns.rdma>=3' 'conns.tcp==0' 'rx.rdma==B' 'tx.rdma==B'
        soft rdma_end "$((3 * SIZE))" 2
    else
        [ "$(grep -c 'sent to a process without rsock as relay ends' srv.log)" -eq 3 ] ||
            soft fail "the acceptor's shim did not send relay ends: $(grep -i 'without rsock' srv.log | paste -sd'|')"
        soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma==3' 'conns.tcp==0' 'tx.tcp==0' 'rx.tcp==0'
        soft rdma_end "$((3 * SIZE))" 1
    fi
    expect_qps_released
}

cell_passed_acceptor_worker() { acceptor_cell shimmed; }
cell_passed_plain_worker() { acceptor_cell plain; }

cell_passed_node_cluster() {
    command -v node > /dev/null || fail "node is not installed (scripts/setup.sh installs nodejs)"
    rdma_begin
    : > served.log
    bg srv $T shimmed "$CELL_DIR/srv" node "$FK/node_cluster.js" "$A" "$PORT" "$DATA" "$CELL_DIR/srv.pid" "$CELL_DIR/served.log"
    wait_until 120 test -s srv.pid || fail "the cluster did not start: $(tail -c 300 srv.err | paste -sd' ')"
    wait_dual srv
    local main i
    main=$(cat srv.pid)
    for i in 1 2 3 4; do
        bg "c$i" $T shimmed "$CELL_DIR/cli" curl -sS --fail --max-time 120 --limit-rate 1M -H 'Connection: close' \
            -o "$CELL_DIR/got$i" "http://$A:$PORT/data.bin"
    done
    for i in 1 2 3 4; do
        bg_wait "c$i" || soft fail "curl $i: $(tail -c 300 "c$i.err" | paste -sd' ')"
        soft expect_same_file "$DATA" "got$i" "curl $i"
    done
    bg_stop qps
    local workers
    workers=$(awk '{ sub("pid=", "", $2); print $2 }' served.log | sort -u | paste -sd' ')
    echo "# primary $main, requests served by workers: $workers; sampled QPs: workers $(qps_of $workers), primary $(qps_of "$main")"
    [ "$(wc -l < served.log)" -eq 4 ] || soft fail "$(wc -l < served.log) requests served, want 4"
    # shellcheck disable=SC2086 # a list of pids
    [ "$(qps_of $workers)" -gt 0 ] || soft fail "no QP was ever a worker's: the streams were not taken over"
    kill -TERM "$main" 2>/dev/null
    bg_wait srv
    soft expect_rdma cli 4
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma>=4' 'conns.tcp==0' 'tx.tcp==0' 'rx.tcp==0'
    soft rdma_end "$((4 * SIZE))" 2
    expect_qps_released
}

# The shim's environment for a program systemd-socket-activate starts: it passes on only
# what -E names (as systemd passes a unit's Environment=).
shim_env_args() {
    local dir=$1
    echo "-E LD_PRELOAD=$T_SO -E RSOCK_STATS_DIR=$dir -E RSOCK_STATS_KEEP=1 -E RSOCK_CONNECT_TIMEOUT_MS=$CTO" \
        "-E RSOCK_LOG=$dir.log -E RSOCK_LOG_LEVEL=${SHIM_LOG_LEVEL:-info}"
}

cell_passed_systemd_activate() {
    command -v systemd-socket-activate > /dev/null || fail "systemd-socket-activate is missing (Debian's systemd package)"
    rdma_begin
    # The activator stands for systemd itself, which no shim is loaded into: it makes a plain
    # kernel listener and starts the service on the first connection.
    # shellcheck disable=SC2046 # shim_env_args prints words
    bg srv $T systemd-socket-activate -l "$A:$PORT" $(shim_env_args "$CELL_DIR/srv") \
        python3 "$FK/activated_echo.py" 4 "$CELL_DIR/events.log"
    wait_listen "$PORT" 60 srv || fail "the activator did not listen"
    # The first connection starts the service (kernel TCP: nothing listens on rdma_cm yet).
    bg first $T python3 "$FK/pass_fds.py" client "$A" "$PORT" "$DATA" "$CELL_DIR/first" 0
    wait_rdma_listen "$PORT" 60 || fail "the activated server did not adopt its listener for RDMA: $(tail -c 300 srv.log 2>/dev/null | paste -sd' ')"
    start_clients 3 500
    bg_wait first || soft fail "first client: $(tail -c 300 first.err | paste -sd' ')"
    soft expect_same_file "$DATA" first "first client"
    check_clients 3
    bg_wait srv || soft fail "server: $(tail -c 300 srv.err | paste -sd' ')"
    grep -q 'inherited listener .* adopted' srv.log || soft fail "the shim's log does not say fd 3 was adopted"
    [ "$(grep -c "^served .* bytes=$SIZE" events.log)" -eq 4 ] ||
        soft fail "the server did not echo 4 whole streams: $(grep '^served' events.log | paste -sd'|')"
    soft expect_rdma cli 3 -D B=$((3 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    soft expect_stats "$CELL_DIR/srv" srv -D B=$((3 * SIZE)) 'conns.rdma==3' 'conns.tcp==1' 'rx.rdma==B' 'tx.rdma==B'
    soft rdma_end "$((3 * SIZE))" 2
    expect_qps_released
}

cell_passed_systemd_accept() {
    command -v systemd-socket-activate > /dev/null || fail "systemd-socket-activate is missing (Debian's systemd package)"
    rdma_begin
    # shellcheck disable=SC2046 # shim_env_args prints words
    bg srv $T shimmed "$CELL_DIR/srv" systemd-socket-activate --accept -l "$A:$PORT" $(shim_env_args "$CELL_DIR/srv") \
        python3 "$FK/activated_echo.py" 1 "$CELL_DIR/events.log"
    wait_dual srv
    start_clients 3 1500
    check_clients 3
    bg_stop qps
    local main servers
    main=$(pgrep -P "$(bg_pid srv)" | head -n1)
    servers=$(awk '/^served /{ sub("pid=", "", $2); print $2 }' events.log | sort -u | paste -sd' ')
    echo "# activator $main; connections served by $servers; sampled QPs: servers $(qps_of $servers), activator $(qps_of "$main")"
    [ "$(grep -c "^served .* bytes=$SIZE" events.log)" -eq 3 ] ||
        soft fail "3 whole streams were not echoed: $(grep '^served' events.log | paste -sd'|')"
    # shellcheck disable=SC2086 # a list of pids
    [ "$(qps_of $servers)" -gt 0 ] || soft fail "no QP was ever a served process's: the streams were not taken over"
    bg_stop srv
    soft expect_rdma cli 3 -D B=$((3 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    soft expect_stats "$CELL_DIR/srv" srv -D B=$((3 * SIZE)) 'conns.rdma>=3' 'conns.tcp==0' 'rx.rdma==B' 'tx.rdma==B'
    soft rdma_end "$((3 * SIZE))" 2
    expect_qps_released
}

# listener_cell HOLD_S [queued]: a listener passed to a worker, its sender exiting after
# HOLD_S s; "queued": the clients connect first, the worker accepts once the sender exits.
listener_cell() {
    local hold=$1 queued=${2:-}
    rdma_begin
    bg worker $T shimmed "$CELL_DIR/srv" python3 "$FK/pass_fds.py" lworker "$CELL_DIR/ch.sock" 3 "$CELL_DIR/events.log" \
        ${queued:+"$CELL_DIR/gate"}
    wait_until 30 test -S "$CELL_DIR/ch.sock" || fail "the worker did not listen: $(tail -c 300 worker.err)"
    bg snd $T shimmed "$CELL_DIR/srv" python3 "$FK/pass_fds.py" lsender "$A" "$PORT" "$CELL_DIR/ch.sock" "$CELL_DIR/events.log" "$hold"
    wait_until 60 grep -q '^received ' events.log || fail "the worker got no listener: $(tail -c 300 worker.err | paste -sd' ')"
    if [ "$hold" = 0 ]; then
        bg_wait snd || fail "sender: $(tail -c 300 snd.err | paste -sd' ')"
        wait_until 60 grep -q 'taking the listener over' srv.log ||
            fail "the worker did not take the listener over: $(tail -c 400 srv.log | paste -sd' ')"
    fi
    wait_dual worker
    start_clients 3 1000
    if [ -n "$queued" ]; then
        # The sender's queue holds them (RDMA, established) until it exits; only then does
        # the worker accept.
        wait_until 60 grep -q '^exit ' events.log || fail "the sender did not exit"
        touch gate
        bg_wait snd || soft fail "sender: $(tail -c 300 snd.err | paste -sd' ')"
        grep -q 'listener(s) handed on .* (0 connection(s) left unaccepted)' srv.log ||
            soft fail "the sender did not hand its queue on: $(grep -i 'handed on\|exit' srv.log | tail -3 | paste -sd'|')"
    fi
    check_clients 3
    bg_wait worker || soft fail "worker: $(tail -c 300 worker.err | paste -sd' ')"
    bg_stop snd
    bg_stop qps
    local wpid spid
    wpid=$(awk '/^received /{ sub("pid=", "", $2); print $2; exit }' events.log)
    spid=$(awk '/^listen /{ sub("pid=", "", $2); print $2; exit }' events.log)
    echo "# sender pid $spid, worker pid $wpid; sampled QPs: worker $(qps_of "$wpid"), sender $(qps_of "$spid")"
    grep -q "pid $spid's listener on .*: accepting through it" srv.log || soft fail "the worker's shim did not recognise the listener"
    [ "$(grep -c "^served pid=$wpid .* bytes=$SIZE" events.log)" -eq 3 ] ||
        soft fail "the worker did not echo 3 whole streams: $(grep '^served' events.log | paste -sd'|')"
    [ "$(qps_of "$wpid")" -gt 0 ] || soft fail "no QP was ever the worker's"
    soft expect_rdma cli 3 -D B=$((3 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    soft expect_stats "$CELL_DIR/srv" srv -D B=$((3 * SIZE)) 'conns.rdma>=3' 'conns.tcp==0' 'rx.rdma==B' 'tx.rdma==B'
    soft rdma_end "$((3 * SIZE))" 2
    expect_qps_released
}

cell_passed_listener_held() { listener_cell 600; }
cell_passed_listener_reload() { listener_cell 0; }
cell_passed_listener_queued() { listener_cell 5 queued; }

cell_passed_exec_listener() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$FK/pass_fds.py" spawner "$A" "$PORT" 2 2 "$CELL_DIR/events.log"
    wait_dual srv
    wait_until 60 bash -c "[ \$(grep -c '^accepting ' events.log) -eq 2 ]" || fail "the children did not start: $(tail -c 300 srv.err | paste -sd' ')"
    start_clients 4 1500
    check_clients 4
    bg_wait srv || soft fail "server: $(tail -c 300 srv.err | paste -sd' ')"
    bg_stop qps
    local main kids
    main=$(awk '/^listen /{ sub("pid=", "", $2); print $2; exit }' events.log)
    kids=$(awk '/^accepting /{ sub("pid=", "", $2); print $2 }' events.log | paste -sd' ')
    # shellcheck disable=SC2086 # a list of pids
    echo "# server $main, exec'd children $kids; sampled QPs: children $(qps_of $kids), server $(qps_of "$main")"
    [ "$(grep -c "^served .* bytes=$SIZE" events.log)" -eq 4 ] ||
        soft fail "the children did not echo 4 whole streams: $(grep '^served' events.log | paste -sd'|')"
    [ "$(grep -c "pid $main's listener on .*: accepting through it" srv.log)" -eq 2 ] ||
        soft fail "the children's shims did not take the listener as the server's: $(grep -i 'listener' srv.log | tail -3 | paste -sd'|')"
    # shellcheck disable=SC2086 # a list of pids
    [ "$(qps_of $kids)" -gt 0 ] || soft fail "no QP was ever a child's"
    soft expect_rdma cli 4 -D B=$((4 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    soft expect_stats "$CELL_DIR/srv" srv -D B=$((4 * SIZE)) 'conns.rdma>=4' 'conns.tcp==0' 'rx.rdma==B' 'tx.rdma==B'
    soft rdma_end "$((4 * SIZE))" 2
    expect_qps_released
}

cell_passed_exec_taken() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$FK/pass_fds.py" forkexec "$A" "$PORT" 3 "$CELL_DIR/events.log"
    wait_dual srv
    start_clients 3 1500
    check_clients 3
    bg_wait srv || soft fail "server: $(tail -c 300 srv.err | paste -sd' ')"
    bg_stop qps
    local main kids
    main=$(awk '/^listen /{ sub("pid=", "", $2); print $2; exit }' events.log)
    kids=$(awk '/^serve /{ sub("pid=", "", $2); print $2 }' events.log | sort -u | paste -sd' ')
    echo "# server $main, children $kids"
    [ "$(grep -c "^served .* bytes=$((SIZE - 1))" events.log)" -eq 3 ] ||
        soft fail "the exec'd images did not echo 3 whole streams: $(grep '^served' events.log | paste -sd'|')"
    # Each child held its connection for a few ms only (too short for the QP sampler): the
    # shims' logs say it moved there and back.
    [ "$(grep -c "taken over from pid $main " srv.log)" -eq 3 ] ||
        soft fail "the children did not take 3 streams over: $(grep 'taken over' srv.log | paste -sd'|')"
    [ "$(grep -c "given back to pid $main before an exec" srv.log)" -eq 3 ] ||
        soft fail "the shim's log does not say 3 streams were given back before exec: $(grep -i 'exec' srv.log | tail -3 | paste -sd'|')"
    soft expect_rdma cli 3 -D B=$((3 * SIZE)) 'tx.rdma==B' 'rx.rdma==B'
    # The server's own counters see only the first byte of each: the rest goes through the
    # relay to a program that reads a plain socket.
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma>=3' 'conns.tcp==0' 'tx.tcp==0' 'rx.tcp==0'
    soft rdma_end "$((3 * SIZE))" 2
    expect_qps_released
}

res_summary > "$T_WORK/res.start"
for c in passed_acceptor_worker passed_plain_worker passed_node_cluster passed_systemd_activate passed_systemd_accept \
    passed_listener_held passed_listener_reload passed_exec_listener passed_exec_taken; do
    selected "$c" || continue
    run_cell "$c"
done
# Run only when named, with why in its comment.
for c in passed_listener_queued; do
    if [ -n "$PATTERN" ] && selected "$c"; then
        run_cell "$c"
    else
        echo "# not run (opt-in, see its comment): $c"
    fi
done
run_cell leaks
t_summary
