#!/usr/bin/env bash
# RDMA fork matrix (issue #9): servers whose connections change process — prefork workers,
# fork after accept, daemons, spawned helpers, exec'd programs, nginx, PostgreSQL — with
# both ends under librsock.so in the Soft-RoCE guest. Each cell checks the data (sha256 of
# both directions, HTTP or pgbench results), the shim's counters of every process of each
# side (`rsock stat --all --json`, RSOCK_STATS_KEEP=1, one stats dir per side and cell),
# rxe0's packet counters, and which process owned each RC QP while connections were open
# (`rdma resource show qp`, sampled; printed as "qp ... role=...").
#
#   cargo build --release --workspace --lib --bins --examples
#   tests/rdma-vm/run.sh --timeout 1800 -- tests/rdma/fork_matrix.sh [PATTERN[,PATTERN...]]
#   tests/rdma-vm/run.sh -e CELLS=nginx,pgbench -- tests/rdma/fork_matrix.sh
#
# Environment:
#   CELLS        cell filter, like the argument: cells whose name contains one of the words
#   T_MB         size of the echoed file in MiB (default 4)
#   T_QP_OWNER   parent|child|any: overrides every cell's expected QP owner (table below)
#   T_KEEP=1     keep the work dir; SHIM_LOG_LEVEL: the shim's log level (default info)
#
# The expected owner of the server side's QPs (EXPECT_QP_OWNER below): "parent" is the
# process that accepted (fork after accept: the listener process; prefork: the master, which
# holds the rdma_cm listener; nginx/PostgreSQL: master/postmaster), "child" any other server
# process (the forked child or worker that serves). A child that uses a connection takes it
# over (the QP moves to it): "child" fails a parent QP seen in more than PARENT_GRACE
# samples that also outlived the children's QPs (fork/qp_owners.py says why both), and
# wants child QPs.
# Every cell prints the expectation; "any" only asserts that server and client QPs were seen.
#
# Clean-up: each cell runs in its own cgroup (cgroup2, mounted here if needed); whatever is
# left when the cell ends (daemons, setsid'd children) is listed as "LEFTOVER" and killed.
# Prints "PASS cell (Ns)" / "FAIL cell: why", then "N passed, N failed"; exit 1 on failure.

set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need curl python3 setpriv pgrep ss timeout sha256sum rdma
PATTERN=${CELLS:-${1:-}}
MB=${T_MB:-4}
MUT=0
A=$RDMA_VM_ADDR
EX=$T_EXAMPLES
FK=$T_ROOT/tests/rdma/fork
T=240     # per-process bound, seconds
CTO=5000  # RSOCK_CONNECT_TIMEOUT_MS: the default 500 ms is too short under TCG
QP_SAMPLE_S=0.3
PARENT_GRACE=4  # samples a parent may own a connection before its child takes it over
PAUSE=2000  # ms each client pauses mid-stream with its connection open (the QP sampler looks)
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-fork-logs/$RUN_ID
# shellcheck source=fork/servers.sh
. "$FK/servers.sh"
PGBIN=$(pg_bin)
ulimit -l unlimited 2>/dev/null || true
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
chmod 755 "$T_WORK"  # postgres (user postgres) reaches its cell's directory

declare -A EXPECT_QP_OWNER=(
    [prefork_blocking]=child [prefork_epoll]=child [prefork_relay]=parent [fork_echo_relay]=parent
    [prefork_redirect]=child [prefork_redirect_blocking]=child [nginx_redirect]=child
    [prefork_redirect_setuid]=child [prefork_redirect_busy]=child [prefork_redirect_skip_busy]=child
    [fork_echo_plain]=child [fork_echo_data_before_fork]=child [fork_echo_shared]=child
    [fork_echo_sinksrc]=child [fork_echo_daemon]=any [fork_echo_daemon_first]=any
    [fork_echo_setuid]=child [fork_echo_raw_clone]=child [fork_echo_stdin_locked]=parent
    [python_forking]=child
    [python_client_control]=parent [subprocess_during_transfer]=parent  # no fork on the server side
    [drop_caps_capset]=parent [drop_caps_syscall]=parent [drop_caps_prctl]=parent
    [children_then_parent]=parent
    [socat_exec]=any [socat_exec_plain]=any [socat_exec_nofork]=any [socat_exec_nofork_plain]=any
    [ncat_sh_exec]=any [ncat_sh_exec_plain]=any
    [nginx_accept_mutex]=child [nginx_epollexclusive]=child [nginx_reuseport]=child
    [nginx_www_data]=child [apache_prefork]=child [gunicorn_user]=child [rsyncd]=any
    [postgres_pgbench]=child
)
SRV_ENV=  # extra environment (VAR=VALUE words) of a cell's server, set for one call
SRV_ARGS=  # more arguments (words) of nofork_server_cell's server, set for one call
owner_of() { echo "${T_QP_OWNER:-${EXPECT_QP_OWNER[$1]:-any}}"; }

echo "# data: ${MB} MiB per echoed stream, active_mtu $MTU, work dir $T_WORK"
echo "# shim: $T_SO ($(sha256sum "$T_SO" | cut -c1-16)); examples: $EX"
DATA=$T_WORK/data.bin
make_random "$DATA" "$MB"
SIZE=$(stat -c %s "$DATA")
DATA_SHA=$(sha_of "$DATA")

# ---- clean-up: one cgroup per cell ------------------------------------------------------------

CG=
cg_init() {
    grep -q '^cgroup2 /sys/fs/cgroup ' /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
    CG=/sys/fs/cgroup/rsock-fork-$$
    if mkdir -p "$CG" 2>/dev/null && [ -e "$CG/cgroup.procs" ]; then
        echo "# clean-up: one cgroup per cell under $CG"
    else
        echo "# WARNING: no cgroup2 ($CG): processes that leave their process group (daemons, setsid) are not swept"
        CG=
    fi
}
# in_cgroup: the cell's shell joins the cell's cgroup (its children follow), then runs the cell.
in_cgroup() {
    if [ -n "$CG" ]; then
        mkdir -p "$CG/$CUR_CELL" && echo "$BASHPID" > "$CG/$CUR_CELL/cgroup.procs"
    fi
    "cell_$CUR_CELL"
}
# cg_sweep NAME: lists and kills what the cell left behind.
cg_sweep() {
    [ -n "$CG" ] && [ -d "$CG/$1" ] || return 0
    local pids p left=()
    pids=$(cat "$CG/$1/cgroup.procs" 2>/dev/null)
    for p in $pids; do left+=("$p:$(cat "/proc/$p/comm" 2>/dev/null)"); done
    if [ ${#left[@]} -gt 0 ]; then
        echo "    LEFTOVER after $1 (killed now): ${left[*]}"
        echo 1 > "$CG/$1/cgroup.kill" 2>/dev/null || for p in $pids; do kill -KILL "$p" 2>/dev/null; done
        wait_until 10 bash -c "[ -z \"\$(cat $CG/$1/cgroup.procs)\" ]"
    fi
    rmdir "$CG/$1" 2>/dev/null
}

# ---- helpers ------------------------------------------------------------------------------------

# main_pid NAME: the pid of the program background command NAME runs (the child of its timeout).
main_pid() { pgrep -P "$(bg_pid "$1")" | head -n1; }

# need_cell CMD...: fails the cell (loudly, not skipped) when a program is missing.
need_cell() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || fail "missing program $c (scripts/setup.sh installs it on the host)"
    done
}

# pid_gone PID: true once PID has exited.
pid_gone() { ! kill -0 "$1" 2>/dev/null; }

# client_ok NAME K: the client's closing line says K/K connections checked out; sets
# CLI_TX, CLI_RX (bytes) and CLI_PIDS (server pids from the trailers).
client_ok() {
    local line
    line=$(grep -E '^(ok|FAILED) ' "$1.out" | tail -n1)
    echo "# client: ${line:-no closing line}"
    grep ' FAIL ' "$1.out" | head -n 3 | sed 's/^/# client: /'
    [[ $line == "ok $2/$2 connections"* ]] ||
        fail "client: ${line:-no result} $(grep -m2 ' FAIL ' "$1.out" | paste -sd'|') $(tail -c 200 "$1.err" | paste -sd' ')"
    CLI_TX=$(sed -n 's/.* tx=\([0-9]*\) .*/\1/p' <<<"$line")
    CLI_RX=$(sed -n 's/.* rx=\([0-9]*\) .*/\1/p' <<<"$line")
    CLI_PIDS=$(sed -n 's/.* pids=\([0-9,-]*\).*/\1/p' <<<"$line")
}

# expect_up_sha NAME: every connection's upload digest is the data file's.
expect_up_sha() {
    local bad
    bad=$(grep '^conn .* ok ' "$1.out" | grep -vc "up_sha=$DATA_SHA")
    [ "$bad" -eq 0 ] || fail "$bad connection(s) sent data whose sha256 is not the file's"
}

# qp_check MAIN_PID [MIN_SERVER [MIN_CLIENT]]: prints the QPs' owners, asserts the cell's
# expected owner (EXPECT_QP_OWNER).
qp_check() {
    local main=$1 ms=${2:-1} mc=${3:-1} exp
    exp=$(owner_of "$CUR_CELL")
    stats_json "$CELL_DIR/srv" stats.srv.all.json 2>/dev/null
    stats_json "$CELL_DIR/cli" stats.cli.all.json 2>/dev/null
    python3 "$FK/qp_owners.py" qps.log --main "$main" --expect "$exp" --parent-grace "$PARENT_GRACE" \
        --min-server "$ms" --min-client "$mc" \
        --server stats.srv.all.json --client stats.cli.all.json > qp_owners.txt
    local rc=$?
    sed 's/^/# /' qp_owners.txt | grep -v '^# qp lqpn' | head -n 5
    grep '^qp lqpn' qp_owners.txt | awk '{ print $3, $4, $5 }' | sort | uniq -c | sed 's/^/# owner: /' | head -n 12
    [ $rc -eq 0 ] || fail "qp owner: $(grep '^FAIL' qp_owners.txt | paste -sd';')"
}

# procs SIDE: one line per process of stats.SIDE.json (pid, comm, conns, bytes, fallbacks).
procs() {
    python3 - "stats.$1.json" "$1" <<'PY' 2>/dev/null
import json, sys
for l in open(sys.argv[1]):
    if l.strip():
        p = json.loads(l)
        nz = lambda d: ",".join(f"{k}={v}" for k, v in d.items() if v) or "-"
        print(f"# {sys.argv[2]} pid {p['pid']} {p['comm']}: conns {nz(p['conns'])} tx {nz(p['tx'])} rx {nz(p['rx'])} fallback {nz(p['fallback'])}")
PY
}

# server_stats K [EXPR...]: the server side's counters, summed over its processes: at least K
# RDMA connections (a child that inherits a connection counts it again: printed, not asserted),
# none on TCP, exactly the client's bytes.
server_stats() {
    local k=$1; shift
    expect_stats "$CELL_DIR/srv" srv -D K="$k" -D TX="$CLI_TX" -D RX="$CLI_RX" \
        'conns.rdma>=K' 'conns.tcp==0' 'rx.rdma==TX' 'tx.rdma==RX' 'rx.tcp==0' 'tx.tcp==0' "$@"
    procs srv | head -n 12
}
# client_stats K [EXPR...]
client_stats() {
    local k=$1; shift
    expect_rdma cli "$k" -D TX="$CLI_TX" -D RX="$CLI_RX" 'tx.rdma==TX' 'rx.rdma==RX' "$@"
    procs cli | head -n 6
}

# events_check LOG MAIN_PID: no error line in the server's event log; children != main.
events_check() {
    [ -s "$1" ] || fail "no event log $1"
    local e
    e=$(grep -m3 '^error' "$1" | paste -sd'|')
    [ -z "$e" ] || fail "server errors: $e"
}

# ---- 1. prefork: workers accept on the inherited listener ----------------------------------------

prefork_cell() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = master)"
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" env $SRV_ENV "$EX/prefork_server" "$A:$PORT" 3 --log "$CELL_DIR/events.log" \
        --hold-ms 500 --pidfile "$CELL_DIR/srv.pid" "$@"
    wait_dual srv
    wait_until 30 test -s srv.pid || fail "no pid file"
    local main fds0
    main=$(cat srv.pid)
    if [ -n "${PREFORK_BRANCHES:-}" ]; then # each worker has its branch before the clients come
        wait_until 30 bash -c "[ \$(grep -c 'redirects to it' $CELL_DIR/srv.log) -ge $PREFORK_BRANCHES ]" ||
            fail "not every worker made a branch: $(grep -c 'redirects to it' srv.log)"
    fi
    fds0=$(ls "/proc/$main/fd" | wc -l)
    bg cli $T shimmed "$CELL_DIR/cli" "$EX/fork_client" "$A:$PORT" --conns 6 --parallel 6 --bytes 1048576 \
        --pause-ms $PAUSE --timeout 60
    local rc=0
    bg_wait cli || rc=$?
    # The master keeps nothing of the connections it handed to its workers (it kept each
    # one's options socket until 2026-11-25: a descriptor per connection, for ever).
    master_fds() { [ "$(ls "/proc/$main/fd" | wc -l)" -le $((fds0 + 1)) ]; }
    wait_until 20 master_fds || soft fail "the master holds $(ls "/proc/$main/fd" | wc -l) fds after 6 connections, $fds0 before"
    kill -TERM "$main" 2>/dev/null
    expect_status srv 0
    bg_stop qps
    soft qp_check "$main"
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 200 cli.err)"
    client_ok cli 6
    soft events_check events.log "$main"
    local workers
    workers=$(awk '/^accept /{ print $2 }' events.log | sort | uniq -c | paste -sd' ')
    echo "# connections per worker: $workers"
    [ "$(awk '/^accept /{ print $2 }' events.log | sort -u | wc -l)" -ge 2 ] ||
        fail "fewer than 2 workers accepted ($workers)"
    grep -q "accept pid=$main " events.log && fail "the master accepted a connection"
    soft client_stats 6 'nproc==1'
    soft server_stats 6
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}
cell_prefork_blocking() { prefork_cell; }
cell_prefork_epoll() { prefork_cell --epoll; }
# The relay, what serves when a take-over cannot be: the owner keeps the QP.
cell_prefork_relay() { SRV_ENV=RSOCK_TAKEOVER=0 prefork_cell --epoll; }
# Redirects (RSOCK_REDIRECT=1 at both ends): each worker makes a branch (an rdma_cm port of
# its own) when it first waits on the listener (epoll_ctl, or accept), and the master sends
# RDMA clients to one in turn: such a connection is set up once, in the worker that serves
# it (counted at both ends), and the QPs are the workers'. A worker serves one connection at
# a time here, and 6 clients come at once to 3 workers: those that land on a busy worker are
# sent back to the master (how many depends on timing) and reach a worker the old way —
# every connection is served, its bytes checked, by prefork_cell.
prefork_redirect_cell() {
    local -x RSOCK_REDIRECT=1
    PREFORK_BRANCHES=3 prefork_cell "$@"
    soft expect_stats "$CELL_DIR/cli" cli 'branches.connects>=1'
    soft expect_stats "$CELL_DIR/srv" srv 'branches.accepts>=1'
}
cell_prefork_redirect() { prefork_redirect_cell --epoll; }
cell_prefork_redirect_blocking() { prefork_redirect_cell; }
# busy_prefork WORKERS HOLD_MS: examples/prefork_server whose workers each hold a client
# HOLD_MS before serving it, started once every worker made its branch; its pid in `main`.
busy_prefork() {
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/prefork_server" "$A:$PORT" "$1" --log "$CELL_DIR/events.log" \
        --hold-ms "$2" --pidfile "$CELL_DIR/srv.pid" --epoll
    wait_dual srv
    wait_until 30 test -s srv.pid || fail "no pid file"
    branches() { [ "$(grep -c 'redirects to it' srv.log)" -ge "$1" ]; }
    wait_until 30 branches "$1" || fail "the workers made no branches"
    main=$(cat srv.pid)
}

# One worker, busy with one client (held 2 s) while a second comes: the second is sent back
# from the branch after 50 ms (logged) and the worker accepts it from the master's queue once
# free (taken over). Both served, bytes checked.
cell_prefork_redirect_busy() {
    local -x RSOCK_REDIRECT=1
    local main rc=0
    rdma_begin
    busy_prefork 1 2000
    bg cli $T shimmed "$CELL_DIR/cli" "$EX/fork_client" "$A:$PORT" --conns 2 --parallel 2 --bytes 1048576 \
        --timeout 60
    bg_wait cli || rc=$?
    kill -TERM "$main" 2>/dev/null
    expect_status srv 0
    bg_stop qps
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 200 cli.err)"
    client_ok cli 2
    soft events_check events.log "$main"
    grep -q "did not accept it in time" srv.log ||
        soft fail "the second client was not sent back from the busy worker's branch"
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==2' 'conns.tcp==0' 'branches.connects==1'
    soft expect_stats "$CELL_DIR/srv" srv 'branches.accepts==1'
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}

# Two workers, each busy 3 s with a first client (A, B); then three clients C, D, E, 0.3 s
# apart: C is redirected to a busy worker and sent back, and says so to the master (the
# hello names the branch: PROTOCOL.md §15), which redirects no one there for a while; D goes
# to the other busy worker and is sent back too; E finds both marked busy and stays with the
# master at once. Exactly 2 send-backs (3 without the marks: E would be redirected to a busy
# worker again); all five served after the holds, bytes checked.
cell_prefork_redirect_skip_busy() {
    local -x RSOCK_REDIRECT=1
    local main rc=0 c
    rdma_begin
    busy_prefork 2 3000
    # The clients start first and each connects when its FIFO says so, 0.3 s apart: a busy
    # branch stays marked for a second, and starting a process under load took up to 0.9 s
    # (a run of 2026-11-29 saw the fifth client come 1.5 s after the third was sent back).
    for c in a b c d e; do
        mkfifo "go.$c"
        bg "cli$c" $T shimmed "$CELL_DIR/cli$c" bash -c 'read -r _ < "$0"; exec "$@"' "go.$c" \
            "$EX/fork_client" "$A:$PORT" --conns 1 --bytes 65536 --timeout 60
    done
    local w
    for c in a b c d e; do
        # Opened for reading and writing, a FIFO never blocks (a client that died first would
        # leave a plain `echo >` waiting), and no process is started between two turns.
        exec {w}<>"go.$c"
        echo go >&"$w"
        exec {w}>&-
        sleep 0.3
    done
    for c in a b c d e; do bg_wait "cli$c" || rc=$?; done
    kill -TERM "$main" 2>/dev/null
    expect_status srv 0
    bg_stop qps
    [ $rc -eq 0 ] || fail "a client exited $rc: $(tail -c 200 cli*.err | paste -sd' ')"
    for c in a b c d e; do client_ok "cli$c" 1; done
    soft events_check events.log "$main"
    local backs
    backs=$(grep -c "did not accept it in time" srv.log)
    echo "# clients sent back by a busy worker: $backs"
    [ "$backs" -eq 2 ] || soft fail "$backs clients sent back, 2 expected (the third must stay with the master)"
    soft expect_stats "$CELL_DIR/srv" srv 'branches.accepts==2'
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}

# Workers that add the listener to their epoll set as root, then drop root (RSOCK_REDIRECT=1):
# the branch made as root goes before setuid (the kernel would refuse its rdma_cm file to the
# new credentials: its clients would wait out their connect timeout), and the next accept
# makes one with the new credentials. Every connection is served, its bytes checked; some
# through a branch made after the drop (the log says the first one went).
cell_prefork_redirect_setuid() {
    local -x RSOCK_REDIRECT=1
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$FK/prefork_setuid.py" "$A" "$PORT" --workers 2 \
        --log "$CELL_DIR/events.log" --pidfile "$CELL_DIR/srv.pid"
    wait_dual srv
    wait_until 30 test -s srv.pid || fail "no pid file"
    wait_until 30 bash -c "[ \$(grep -c '^worker ' $CELL_DIR/events.log 2>/dev/null) -ge 2 ]" || fail "workers did not drop root"
    local main
    main=$(cat srv.pid)
    bg cli $T shimmed "$CELL_DIR/cli" python3 "$FK/echo_client.py" "$A" "$PORT" "$DATA" --conns 4 \
        --pause-ms $PAUSE # (the QP sampler sees both ends)
    local rc=0
    bg_wait cli || rc=$?
    kill -TERM "$main" 2>/dev/null
    bg_wait srv
    bg_stop qps
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 300 cli.err | paste -sd' ')"
    client_ok cli 4
    expect_up_sha cli
    soft events_check events.log "$main"
    grep -q "no branch here from now on" "$CELL_DIR"/srv.log ||
        soft fail "no branch was closed before the credential change"
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==4' 'conns.tcp==0' 'branches.connects>=1'
    soft expect_stats "$CELL_DIR/srv" srv 'branches.accepts>=1'
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}

# A server that speaks first, through branches: each of 2 workers writes a 256 KiB banner as
# soon as accept() returns (the client's RTU may not have come yet: the stream's writes wait
# for the connection to be established) and takes the listener out of its epoll set while
# it serves (as nginx's worker that lost the accept_mutex does: a stream left queued in it
# would wait there). 6 clients at once; banners and uploads sha-checked.
cell_prefork_banner() {
    local -x RSOCK_REDIRECT=1
    local main rc=0
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$FK/banner_prefork.py" serve "$A" "$PORT" --workers 2 \
        --log "$CELL_DIR/events.log" --pidfile "$CELL_DIR/srv.pid"
    wait_dual srv
    wait_until 30 test -s srv.pid || fail "no pid file"
    wait_until 30 bash -c "[ \$(grep -c 'redirects to it' $CELL_DIR/srv.log) -ge 2 ]" ||
        fail "not every worker made a branch: $(grep -c 'redirects to it' srv.log)"
    main=$(cat srv.pid)
    # Each client holds its connection 1.5 s after the banner, so that the QP sampler (every
    # 0.5 s) sees them: a run on 2026-11-29 saw them in one sample of ten.
    bg cli $T shimmed "$CELL_DIR/cli" python3 "$FK/banner_prefork.py" connect "$A" "$PORT" "$DATA" \
        --conns 6 --timeout 60 --hold-ms 1500
    bg_wait cli || rc=$?
    kill -TERM "$main" 2>/dev/null
    expect_status srv 0
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 300 cli.err | paste -sd' ')"
    client_ok cli 6
    soft events_check events.log "$main"
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==6' 'conns.tcp==0' 'branches.connects>=1'
    soft expect_stats "$CELL_DIR/srv" srv 'branches.accepts>=1'
    soft rdma_end "$((CLI_TX + CLI_RX))" 2
    expect_qps_released
}

# A master that leaves its workers the listener while they wait on it in epoll_wait: it
# re-execs itself (haproxy's master-worker mode; the new image holds the listener) or exits (a
# daemon that listens, then detaches). Its going hangs up the workers' doorbell of its
# listener, and they take the listener over: one of them listens on rdma_cm again and serves
# the clients over RDMA. Until 2026-11-29 each worker kept a copy of the master's end of that
# doorbell from the fork, so it never hung up: the workers slept on while connections queued
# in the kernel (haproxy as Debian ships it accepted nothing).
master_leaves_cell() {
    local rc=0 w
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$FK/master_leaves.py" "$A" "$PORT" --leave "$1" \
        --log "$CELL_DIR/events.log" --pidfile "$CELL_DIR/srv.pid"
    wait_until 30 test -s srv.pid || fail "no pid file: $(tail -c 300 srv.err | paste -sd' ')"
    took() { [ "$(grep -c 'taking the listener over' "$CELL_DIR/srv.log")" -ge 2 ]; }
    wait_until 30 took || fail "the workers did not take the listener over ($(grep -c 'taking the listener over' srv.log) of 2)"
    wait_rdma_listen "$PORT" 30 || fail "no rdma_cm listener on $PORT after the take-over"
    bg cli $T shimmed "$CELL_DIR/cli" "$EX/fork_client" "$A:$PORT" --conns 4 --parallel 2 --bytes 1048576 \
        --pause-ms $PAUSE --timeout 60
    bg_wait cli || rc=$?
    for w in $(cat srv.pid); do kill -TERM "$w" 2>/dev/null; done
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 200 cli.err)"
    client_ok cli 4
    soft events_check events.log
    soft client_stats 4 'nproc==1'
    soft server_stats 4
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}
cell_master_leaves_exec() { master_leaves_cell exec; }
cell_master_leaves_exit() { master_leaves_cell exit; }

# haproxy as Debian ships it (/etc/haproxy/haproxy.cfg: chroot /var/lib/haproxy, user haproxy;
# `haproxy -Ws` as its systemd unit runs it: a master that forks the worker and re-execs
# itself), with a frontend on $PORT and a shimmed backend. The worker chroots before its
# first connection, so it cannot reach the RDMA device (LIMITATIONS: chroot): everything on
# kernel TCP, without a client waiting out its RDMA connect. Until 2026-11-29 it accepted
# nothing (master_leaves_exec).
cell_haproxy_packaged() { haproxy_cell chroot; }
# The same without the chroot line: the worker drops to user haproxy with the device in
# reach, but sets RLIMIT_NPROC to 0 (no thread, no process) before the shim could start its
# helper thread, which alone feeds a dual listener and frees closed streams. Its listener
# and its connections to the backend must be kernel TCP (until 2026-11-29 the listener
# accepted nothing; then its backend connections were RDMA streams nobody freed).
cell_haproxy_nochroot() { haproxy_cell nochroot; }

# haproxy_cell chroot|nochroot
haproxy_cell() {
    need_cell haproxy curl
    local i bport
    alloc_port bport
    mkdir -p /run/haproxy /var/lib/haproxy www && ln -sf "$DATA" www/data.bin
    { if [ "$1" = chroot ]; then cat /etc/haproxy/haproxy.cfg; else grep -v '^[[:space:]]*chroot' /etc/haproxy/haproxy.cfg; fi
      printf 'frontend web\n\tbind :%s\n\tdefault_backend app\nbackend app\n\tserver s1 %s:%s\n' "$PORT" "$A" "$bport"
    } > haproxy.cfg
    bg be $T shimmed "$CELL_DIR/be" python3 -m http.server "$bport" --bind "$A" --directory "$CELL_DIR/www"
    wait_listen "$bport" 30 be || fail "the backend did not listen"
    bg srv $T shimmed "$CELL_DIR/srv" haproxy -Ws -f "$CELL_DIR/haproxy.cfg" -p "$CELL_DIR/haproxy.pid"
    wait_listen "$PORT" 30 srv || fail "haproxy did not listen: $(tail -c 300 srv.err | paste -sd' ')"
    wait_until 30 test -s haproxy.pid || fail "haproxy wrote no pid file"
    echo "# processes: $(ps -o pid=,user=,args= --ppid "$(cat haproxy.pid)" | paste -sd'|')"
    for i in 1 2 3; do
        shimmed "$CELL_DIR/cli" curl -sS --max-time 60 -o "got.$i" "http://$A:$PORT/data.bin" || fail "curl $i exited $?"
        expect_same_file "$DATA" "got.$i" "curl $i"
    done
    curl -sS --max-time 60 -o got.plain "http://$A:$PORT/data.bin" || fail "plain curl exited $?"
    expect_same_file "$DATA" got.plain "plain curl"
    wait_until 10 no_rc_qps || fail "$(rc_qps) RC QP(s) listed with haproxy running and its clients gone"
    kill -TERM "$(cat haproxy.pid)" 2>/dev/null
    expect_stats "$CELL_DIR/cli" cli 'conns.tcp==3' 'conns.rdma==0'
    procs cli
    grep -q 'listening on 0.0.0.0:'"$PORT"'  tcp only' <(env -u LD_PRELOAD "$T_BIN" stat --dir "$CELL_DIR/srv" --all) ||
        fail "haproxy's worker does not list its listener as kernel TCP only"
    expect_stats "$CELL_DIR/be" be 'conns.rdma==0' 'conns.tcp>=1'
}

# OpenSSH's sshd as Debian ships it (/etc/ssh/sshd_config untouched: port 22, root by key):
# the listening process forks per connection and the child re-execs sshd with the
# connection on its stdin and stdout (relayed by the listening process). The key is
# restricted to the client's address (`from=`), which sshd reads from the socket: until
# 2026-11-29 the re-exec'd sshd found an AF_UNIX socket there ("from  port 0" in its log,
# SSH_CONNECTION empty), and a `from=` key or `Match Address` could never match.
cell_sshd_packaged() {
    [ -x /usr/sbin/sshd ] || fail "missing program /usr/sbin/sshd (scripts/setup.sh installs openssh-server on the host)"
    need_cell ssh ssh-keygen
    local PORT=22 conn
    mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh
    ssh-keygen -q -t ed25519 -N '' -f key
    echo "from=\"$A\" $(cat key.pub)" > /root/.ssh/authorized_keys
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" /usr/sbin/sshd -D -e
    wait_dual srv
    shimmed "$CELL_DIR/cli" ssh -i key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o BatchMode=yes -o LogLevel=ERROR "root@$A" "echo \$SSH_CONNECTION >&2; cat $DATA" > got.bin 2> ssh.err ||
        fail "ssh exited $?: $(tail -c 300 ssh.err | paste -sd' ') | sshd: $(tail -c 300 srv.err | paste -sd' ')"
    expect_same_file "$DATA" got.bin ssh
    conn=$(head -n1 ssh.err)
    echo "# SSH_CONNECTION: $conn; sshd: $(grep -m1 'Accepted publickey' srv.err | cut -c1-80)"
    read -r -a f <<<"$conn"
    [ "${f[0]:-}" = "$A" ] && [ "${f[2]:-}" = "$A" ] && [ "${f[3]:-}" = 22 ] && [ "${f[1]:-0}" -gt 0 ] ||
        fail "SSH_CONNECTION is '$conn', want '$A <port> $A 22'"
    grep -q "Accepted publickey for root from $A port ${f[1]}" srv.err || fail "sshd logged no login from $A port ${f[1]}"
    kill -TERM "$(main_pid srv)" 2>/dev/null
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==1' 'conns.tcp==0'
    soft rdma_end "$SIZE" 2
    rm -f /root/.ssh/authorized_keys
}

# Dovecot's IMAP server as Debian ships it (dovecot-imapd, its config untouched but for
# the log's path; port 143 on every address): the master makes the listeners as root,
# then drops capabilities (libcap's capset); an imap-login process (user dovenull,
# chrooted, so without the device: its connection is relayed by the master) accepts and
# passes the connection with SCM_RIGHTS to an imap process running as the mail user.
# Python's imaplib logs in, APPENDs a message of the data file in base64 and FETCHes it
# back, twice. Until 2026-11-29 the master's posts failed after its capset (EACCES) and
# every APPEND broke after 16 KiB.
cell_dovecot_packaged() {
    [ -x /usr/sbin/dovecot ] || fail "missing program /usr/sbin/dovecot (scripts/setup.sh installs dovecot-imapd on the host)"
    local PORT=143 i line
    id rsockmail >/dev/null 2>&1 || useradd -m rsockmail || fail "cannot add the mail user"
    echo rsockmail:rsock-pw | chpasswd || fail "cannot set the mail user's password"
    install -o rsockmail -g mail -m 660 /dev/null /var/mail/rsockmail
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" /usr/sbin/dovecot -F -o log_path="$CELL_DIR/dovecot.log"
    wait_dual srv
    for i in 1 2; do
        shimmed "$CELL_DIR/cli" python3 "$FK/imap_roundtrip.py" "$A" rsockmail rsock-pw "$DATA" > "imap.$i" 2> "imap.$i.err" ||
            fail "imap client $i exited $?: $(tail -c 300 "imap.$i.err" | paste -sd' ') | dovecot: $(grep -v ' Info: ' dovecot.log | tail -c 300 | paste -sd' ')"
        line=$(cat "imap.$i")
        echo "# imap $i: ${line:0:40}"
        [[ $line == *"fetched_sha=$DATA_SHA" ]] || fail "imap $i: the fetched body's sha256 is not the file's: $line"
    done
    echo "# dovecot: $(grep -c 'Login: user=<rsockmail>' dovecot.log) logins, $(grep -c 'Logged out' dovecot.log) logged out"
    kill -TERM "$(cat /run/dovecot/master.pid 2>/dev/null)" 2>/dev/null
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==2' 'conns.tcp==0'
    soft rdma_end "$SIZE" 2
    userdel -r rsockmail 2>/dev/null; rm -f /var/mail/rsockmail
}

# Samba's smbd as Debian ships it (samba, its smb.conf untouched: ports 445 and 139 on every
# address, a read-only [homes] share): the root daemon forks a child per connection, the
# child takes the stream over, and then switches its thread's uid per request through
# syscall(SYS_setresuid) (libutil-setid). Before its first switch the child gives the stream
# back to the daemon, which relays it (posting needs the credentials that opened the
# device). smbclient gets the data file twice per connection, two connections.
cell_samba_packaged() {
    [ -x /usr/sbin/smbd ] || fail "missing program /usr/sbin/smbd (scripts/setup.sh installs samba on the host)"
    need_cell smbclient smbpasswd
    local PORT=445 i k
    id rsocksmb >/dev/null 2>&1 || useradd -m rsocksmb || fail "cannot add the share's user"
    install -o rsocksmb -m 644 "$DATA" /home/rsocksmb/data.bin
    printf 'rsock-pw\nrsock-pw\n' | smbpasswd -s -a rsocksmb > smbpasswd.out 2>&1 || fail "smbpasswd: $(cat smbpasswd.out)"
    mkdir -p /run/samba /var/log/samba
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" /usr/sbin/smbd --foreground --no-process-group
    wait_dual srv
    for i in 1 2; do
        shimmed "$CELL_DIR/cli" smbclient "//$A/rsocksmb" -U rsocksmb%rsock-pw \
            -c "get data.bin got.$i.a; get data.bin got.$i.b" > "smb.$i" 2>&1 ||
            fail "smbclient $i exited $?: $(tail -c 300 "smb.$i" | paste -sd' ')"
        for k in a b; do expect_same_file "$DATA" "got.$i.$k" "smbclient $i ($k)"; done
    done
    local back
    back=$(grep -c 'given back to pid .* before a credential change' "$CELL_DIR/srv.log")
    echo "# smbd: $back of 2 session processes gave their stream back before switching uid"
    [ "$back" -eq 2 ] || soft fail "$back of 2 smbd session processes gave their stream back (server log)"
    kill -TERM "$(main_pid srv)" 2>/dev/null
    soft expect_stats "$CELL_DIR/cli" cli 'conns.rdma==2' 'conns.tcp==0'
    soft rdma_end "$((SIZE * 4))" 2
    smbpasswd -x rsocksmb > /dev/null 2>&1; userdel -r rsocksmb 2>/dev/null
    expect_qps_released
}

# ---- 2. fork after accept ---------------------------------------------------------------------

# fork_echo_cell K CLIENT_ARGS -- SERVER_ARGS: K connections of examples/fork_client
# against examples/fork_echo (which exits after K).
fork_echo_cell() {
    local k=$1; shift
    local cargs=() sargs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do cargs+=("$1"); shift; done
    shift
    sargs=("$@")
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the accepting process)"
    # Children that drop root still append to the event log.
    touch "$CELL_DIR/events.log" && chmod 666 "$CELL_DIR/events.log"
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" env $SRV_ENV "$EX/fork_echo" "$A:$PORT" --log "$CELL_DIR/events.log" \
        --pidfile "$CELL_DIR/srv.pid" --max-conns "$k" --timeout 60 "${sargs[@]}"
    local main daemon=0
    [[ " ${sargs[*]} " == *" --daemon"* ]] && daemon=1
    if [ $daemon = 1 ]; then
        expect_status srv 0  # the process we started exits once it has daemonized
        wait_until 30 test -s srv.pid || fail "the daemon wrote no pid file"
        main=$(cat srv.pid)
        echo "# daemon pid $main (sid $(ps -o sid= -p "$main" 2>/dev/null | tr -d ' '))"
        wait_listen "$PORT" 60 || fail "daemon did not listen on TCP $PORT"
        wait_rdma_listen "$PORT" 60 || fail "daemon listens on TCP but not on rdma_cm port $PORT"
    else
        wait_dual srv
        main=$(cat srv.pid)
    fi
    bg cli $T shimmed "$CELL_DIR/cli" "$EX/fork_client" "$A:$PORT" --conns "$k" --pause-ms $PAUSE \
        --timeout 60 "${cargs[@]}"
    local rc=0
    bg_wait cli || rc=$?
    if [ $daemon = 1 ]; then
        wait_until 90 pid_gone "$main" || fail "daemon $main still running 90 s after its clients"
    else
        local src=0
        bg_wait srv || src=$?
        [ $src -eq 0 ] || soft fail "server exited $src: $(tail -c 300 srv.err | paste -sd' ')"
    fi
    bg_stop qps
    soft qp_check "$main"
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 200 cli.err)"
    client_ok cli "$k"
    soft events_check events.log "$main"
    grep -q "^exit pid=$main status=0" events.log || soft fail "server: $(grep '^exit' events.log || echo 'no exit line')"
    # Every connection was served by a child, not by the accepting process.
    local kids
    kids=$(awk '/^serve /{ print $2 }' events.log | sort -u | wc -l)
    echo "# served by $kids child process(es); accepting process $main; client saw pids $CLI_PIDS"
    [ "$kids" -eq "$k" ] || soft fail "$kids distinct children served, want $k"
    [[ ,$CLI_PIDS, == *,$main,* ]] && soft fail "the accepting process served a connection itself"
    soft client_stats "$k" 'nproc==1'
    soft server_stats "$k"
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}
cell_fork_echo_plain() { fork_echo_cell 4 --file "$DATA" --parallel 2 --; expect_up_sha cli; }
cell_fork_echo_relay() {
    SRV_ENV=RSOCK_TAKEOVER=0 fork_echo_cell 3 --file "$DATA" --parallel 3 --
    expect_up_sha cli
}
cell_fork_echo_data_before_fork() {
    fork_echo_cell 2 --file "$DATA" -- --wait-data 10000
    local n
    n=$(grep -c 'readable_before_fork=1' events.log)
    echo "# connections readable (unread bytes queued) when the parent forked: $n of 2"
    [ "$n" -eq 2 ] || fail "only $n of 2 connections had data queued at fork time (the test did not test it)"
    expect_up_sha cli
}
cell_fork_echo_shared() { fork_echo_cell 3 --file "$DATA" --parallel 3 -- --mode shared; expect_up_sha cli; }
cell_fork_echo_sinksrc() { fork_echo_cell 2 --op sinksrc --bytes "$SIZE" --down "$SIZE" --parallel 2 --; }
# The child drops root (setgroups, setgid, setuid to nobody) before its first read, as
# rsyncd and inetd services do: it still takes its connection over.
cell_fork_echo_setuid() {
    fork_echo_cell 3 --file "$DATA" --parallel 3 -- --drop-to 65534
    expect_up_sha cli
    local dropped
    dropped=$(grep -c '^serve .* uid=65534$' events.log)
    [ "$dropped" -eq 3 ] || soft fail "want 3 children serving as uid 65534, saw $dropped"
}
# The server forks with the raw clone system call (syscall(SYS_clone, SIGCHLD)), as vsftpd
# does: glibc runs no fork handler, the shim's syscall hook does.
cell_fork_echo_raw_clone() { fork_echo_cell 3 --file "$DATA" --parallel 3 -- --raw-clone; expect_up_sha cli; }
# vsftpd's session process: a raw clone, the connection dup2'd onto fd 0 and the original
# closed, then RLIMIT_NOFILE 0 before the first read. The stream is relayed at the dup2 (a
# take-over or a relay asked for later would need fds): the parent keeps the QP.
cell_fork_echo_stdin_locked() {
    fork_echo_cell 3 --file "$DATA" --parallel 3 -- --raw-clone --stdin-locked
    expect_up_sha cli
}
cell_fork_echo_daemon() { fork_echo_cell 2 --file "$DATA" -- --daemon --idle-exit 120; expect_up_sha cli; }
cell_fork_echo_daemon_first() { fork_echo_cell 2 --file "$DATA" -- --daemon-first --idle-exit 120; expect_up_sha cli; }

# ---- 3. python: ForkingTCPServer; spawning children during a transfer -------------------------------

cell_python_forking() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the ForkingTCPServer process)"
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" python3 "$FK/forking_server.py" "$A" "$PORT" --log "$CELL_DIR/events.log" \
        --pidfile "$CELL_DIR/srv.pid" --max-conns 2
    wait_dual srv
    local main
    main=$(cat srv.pid)
    bg cli $T shimmed "$CELL_DIR/cli" python3 "$FK/echo_client.py" "$A" "$PORT" "$DATA" --conns 2 --pause-ms $PAUSE
    local rc=0
    bg_wait cli || rc=$?
    local src=0
    bg_wait srv || src=$?
    bg_stop qps
    soft qp_check "$main"
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 300 cli.err | paste -sd' ')"
    [ $src -eq 0 ] || soft fail "server exited $src: $(tail -c 300 srv.err | paste -sd' ')"
    client_ok cli 2
    expect_up_sha cli
    soft events_check events.log "$main"
    echo "# served by: $(awk '/^served /{ print $2 }' events.log | paste -sd' ')"
    soft client_stats 2 'nproc==1'
    soft server_stats 2
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}

# nofork_server_cell CLIENT_CMD...: one connection to examples/fork_echo --mode nofork
# (SRV_ARGS: more of its arguments, words).
nofork_server_cell() {
    rdma_begin
    # shellcheck disable=SC2086 # SRV_ARGS is a word list
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/fork_echo" "$A:$PORT" --mode nofork --max-conns 1 \
        --log "$CELL_DIR/events.log" --pidfile "$CELL_DIR/srv.pid" --timeout 120 $SRV_ARGS
    wait_dual srv
    local main
    main=$(cat srv.pid)
    bg cli $T shimmed "$CELL_DIR/cli" "$@"
    local rc=0 src=0
    bg_wait cli || rc=$?
    bg_wait srv || src=$?
    bg_stop qps
    soft qp_check "$main"
    sed 's/^/# /' cli.out | grep '^# action'
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -v '^action .* ok$' cli.out | head -n 4 | paste -sd'|') $(tail -c 300 cli.err | paste -sd' ')"
    [ $src -eq 0 ] || soft fail "server exited $src: $(tail -c 300 srv.err | paste -sd' ')"
    client_ok cli 1
    grep -q "up_sha=$DATA_SHA" cli.out || fail "the transfer's digest is not the file's"
    # The client's forked python children count as processes of their own (no connections).
    soft client_stats 1
    soft server_stats 1 'nproc==1'
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}

# The control of the next cell: the same python client and server, no children.
cell_python_client_control() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (no fork anywhere: the control)"
    nofork_server_cell python3 "$FK/echo_client.py" "$A" "$PORT" "$DATA" --pause-ms $PAUSE
}

# The client's fork children use its connection one after another and exit (os._exit,
# exit(), or after reading their part's echo) while it holds on; it reads each echo once
# the child is gone, then sends the rest itself. Each child took the connection over and
# gave it back as it exited: a TCP connection stays with the processes that hold it (until
# 2026-11-29 the first child's exit ended it: the parent read EOF).
cell_children_then_parent() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (the server does not fork; the client's children use its connection)"
    nofork_server_cell python3 "$FK/child_then_parent.py" "$A" "$PORT" "$DATA"
    grep '^child ' cli.out | paste -sd' ' | sed 's/^/# /'
    local back
    back=$(grep -c 'given back to pid' "$CELL_DIR/cli.log")
    echo "# client: $back of 6 children gave the connection back as they exited"
    [ "$back" -eq 6 ] || soft fail "$back of 6 children gave the connection back (client log)"
}

# The server installs new credentials once it listens, its ids unchanged, as Dovecot's
# master drops capabilities (libcap's capset) after it made its listeners. The kernel lets
# only the credentials object that opened the verbs and rdma_cm files use them: until
# 2026-11-29 the shim knew only the set*id calls, the server's posts failed with EACCES and
# the connection died after its first 16 KiB (Dovecot's APPEND of a large message). Three
# ways in: libc's capset, syscall(SYS_capset), prctl(PR_SET_KEEPCAPS).
drop_caps_cell() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (no fork: the server drops capabilities with $1)"
    SRV_ARGS="--drop-caps $1" nofork_server_cell python3 "$FK/echo_client.py" "$A" "$PORT" "$DATA" --pause-ms $PAUSE
    grep -q "^caps pid=.* how=$1" events.log || fail "the server logged no capability change"
    grep -q 'over RDMA again, with the new credentials' "$CELL_DIR/srv.log" ||
        fail "the server's listener was not made again for the new credentials"
}
cell_drop_caps_capset() { drop_caps_cell capset; }
cell_drop_caps_syscall() { drop_caps_cell syscall; }
cell_drop_caps_prctl() { drop_caps_cell prctl; }

cell_subprocess_during_transfer() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (the server does not fork; the client spawns)"
    nofork_server_cell python3 "$FK/spawn_during_transfer.py" "$A" "$PORT" "$DATA"
}

# ---- 4. socat / ncat: fork, then exec a program (preloaded or not) ----------------------------------

# exec_cell SERVER_CMD...: 2 connections echoed by `cat` behind a forking relay.
exec_cell() {
    need_cell "$1"
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the listening socat/ncat)"
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" "$@"
    wait_dual srv
    local main
    main=$(main_pid srv)
    bg cli $T shimmed "$CELL_DIR/cli" "$EX/fork_client" "$A:$PORT" --op raw --file "$DATA" --conns 2 \
        --parallel 2 --pause-ms $PAUSE --timeout 60
    local rc=0
    bg_wait cli || rc=$?
    bg_stop qps
    soft qp_check "$main"
    bg_stop srv
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 200 cli.err)"
    client_ok cli 2
    expect_up_sha cli
    soft client_stats 2 'nproc==1'
    if [ "${EXEC_HOLDS:-0}" = 1 ]; then
        # The exec'd program holds the connection as a plain relay socket (its shim, if any,
        # does not own it), so no server process counts its bytes: they are checked by sha256
        # at the client and on the device; the server side counted the connections.
        soft expect_stats "$CELL_DIR/srv" srv -D K=2 'conns.rdma>=K' 'conns.tcp==0'
    else
        soft server_stats 2
    fi
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}
SOCAT_L() { echo "TCP-LISTEN:$PORT,bind=$A,fork,reuseaddr"; }
cell_socat_exec() { exec_cell socat "$(SOCAT_L)" EXEC:cat; }
cell_socat_exec_plain() { exec_cell socat "$(SOCAT_L)" "EXEC:env -u LD_PRELOAD cat"; }
cell_socat_exec_nofork() { EXEC_HOLDS=1 exec_cell socat "$(SOCAT_L)" EXEC:cat,nofork; }
cell_socat_exec_nofork_plain() { EXEC_HOLDS=1 exec_cell socat "$(SOCAT_L)" "EXEC:env -u LD_PRELOAD cat,nofork"; }

# ncat_cell CMD: `ncat -l -k --sh-exec CMD`. ncat copies with blocking writes into CMD's pipe
# and drops the connection when the socket reads end of stream, so a full-duplex bulk client
# or a half-close fails on kernel TCP too: each connection sends 48 KiB (below a pipe's
# capacity), reads it back, then closes.
ncat_cell() {
    need_cell ncat
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the listening ncat)"
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" ncat -l -k --sh-exec "$1" "$A" "$PORT"
    wait_dual srv
    local main n=49152 k=3
    main=$(main_pid srv)
    bg cli $T shimmed "$CELL_DIR/cli" python3 "$FK/raw_echo_client.py" "$A" "$PORT" $n $k --timeout 60
    local rc=0
    bg_wait cli || rc=$?
    bg_stop srv
    [ $rc -eq 0 ] || fail "client exited $rc: $(grep -m3 FAIL cli.out | paste -sd'|') $(tail -c 200 cli.err)"
    grep -q "^ok $k/$k " cli.out || fail "client: $(tail -n1 cli.out)"
    soft expect_rdma cli $k -D T=$((n * k)) 'tx.rdma==T' 'rx.rdma==T'
    soft expect_stats "$CELL_DIR/srv" srv -D K=$k 'conns.rdma>=K' 'conns.tcp==0'
    # Short sequential connections can fall between the QP sampler's looks: the path is
    # asserted by the client's counters and the device's packets, not by a QP count.
    soft rdma_end $((n * k)) 0
    expect_qps_released
}
cell_ncat_sh_exec() { ncat_cell cat; }
cell_ncat_sh_exec_plain() { ncat_cell "env -u LD_PRELOAD cat"; }

# ---- 5. nginx: master + 2 workers ---------------------------------------------------------------

# http_round MAIN: 4 shimmed curls of /data.bin at once (rate-limited, so that they overlap
# and the QP sampler sees them) and one plain curl (kernel TCP: peer_tcp expected) against
# the HTTP server on $A:$PORT whose main process is MAIN; checks the bytes, the QPs' owners,
# and the counters of both sides.
http_round() {
    local main=$1 i
    for i in 1 2 3 4; do
        bg "cli$i" $T shimmed "$CELL_DIR/cli" curl -sS --fail --max-time 60 --limit-rate 1M \
            -o "$CELL_DIR/got$i.bin" -w '%{size_download} %{size_header} %{size_request}\n' "http://$A:$PORT/data.bin"
    done
    bg plain $T curl -sS --fail --max-time 60 -o "$CELL_DIR/plain.bin" \
        -w '%{size_download} %{size_header} %{size_request}\n' "http://$A:$PORT/data.bin"
    local bad=() rc n
    for i in 1 2 3 4 plain; do
        [ "$i" = plain ] && n=plain || n=cli$i
        rc=0; bg_wait "$n" || rc=$?
        [ $rc -eq 0 ] || bad+=("$n: status $rc $(tail -c 150 "$n.err" | paste -sd' ')")
    done
    bg_stop qps
    soft qp_check "$main" 1 1
    # The server is stopped once its counters are read: Apache's parent connects to itself
    # at shutdown to wake its children, which is no client's traffic.
    [ ${#bad[@]} -eq 0 ] || { HTTP_STOP; fail "curl failed: ${bad[*]}"; }
    CLI_TX=0 CLI_RX=0
    local dl hdr req
    for i in 1 2 3 4; do
        soft expect_same_file "$DATA" "got$i.bin" "curl $i"
        read -r dl hdr req < "cli$i.out" || fail "no curl -w output ($i)"
        CLI_TX=$((CLI_TX + req)) CLI_RX=$((CLI_RX + dl + hdr))
    done
    soft expect_same_file "$DATA" plain.bin "plain curl"
    read -r dl hdr req < plain.out || fail "no curl -w output (plain)"
    soft expect_stats "$CELL_DIR/cli" cli -D TX="$CLI_TX" -D RX="$CLI_RX" 'nproc==4' 'conns.rdma==4' 'conns.tcp==0' \
        'tx.rdma==TX' 'rx.rdma==RX' 'sockets==[]'
    # The plain curl is the one expected fallback: kernel TCP, reason peer_tcp, at the server.
    soft expect_stats "$CELL_DIR/srv" srv -D TX="$CLI_TX" -D RX="$CLI_RX" -D PTX="$req" -D PRX=$((dl + hdr)) \
        'conns.rdma>=4' 'conns.tcp>=1' 'fallback.peer_tcp==conns.tcp' 'sum(vars(fallback).values())==conns.tcp' \
        'rx.rdma==TX' 'tx.rdma==RX' 'rx.tcp==PTX' 'tx.tcp==PRX'
    procs srv
    HTTP_STOP
    soft rdma_end "$CLI_RX" 2
    expect_qps_released
}

# nginx_cell ACCEPT_MUTEX [LISTEN_OPTS]: nginx, master + 2 workers, with no `user` line (the
# workers run as nobody) unless NGINX_USER says otherwise, through http_round.
nginx_cell() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the nginx master); accept_mutex $1 ${2:-}; user ${NGINX_USER:-(none)}"
    need_cell nginx
    nginx_conf "$CELL_DIR" "$A" "$PORT" "$@"
    ln -sf "$DATA" www/data.bin
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" nginx -p "$CELL_DIR" -c "$CELL_DIR/nginx.conf" -e "$CELL_DIR/nginx-error.log"
    wait_dual srv
    wait_until 30 test -s nginx.pid || fail "nginx wrote no pid file: $(tail -c 300 nginx-error.log)"
    local main
    main=$(cat nginx.pid)
    echo "# worker users: $(ps -o user= --ppid "$main" | sort | uniq -c | paste -sd' ')"
    HTTP_STOP() { bg_stop srv; }
    http_round "$main"
    echo "# requests per worker pid: $(awk '{ print $1 }' access.log | sort | uniq -c | paste -sd' ')"
    local e
    e=$(grep -E '\[(alert|crit|emerg|error)\]' nginx-error.log | head -n 3 | paste -sd'|')
    [ -z "$e" ] || soft fail "nginx error log: $e"
}
cell_nginx_accept_mutex() { nginx_cell on; }
cell_nginx_epollexclusive() { nginx_cell off; }
cell_nginx_reuseport() { nginx_cell off reuseport; }
# Debian's packaged nginx.conf names its user: www-data.
cell_nginx_www_data() { NGINX_USER=www-data nginx_cell on; }
# nginx as Debian ships it (www-data workers, accept_mutex off) with redirects: the curls
# connect to the workers' branches (and the plain curl to the kernel listener, as before); one
# redirected to a worker busy with another download is sent back to the master after 50 ms.
cell_nginx_redirect() {
    local -x RSOCK_REDIRECT=1
    NGINX_USER=www-data nginx_cell off
    soft expect_stats "$CELL_DIR/cli" cli 'branches.connects>=1'
    soft expect_stats "$CELL_DIR/srv" srv 'branches.accepts>=1'
}

# Apache httpd, prefork MPM, children as nobody (`User`), 2 children to start with.
cell_apache_prefork() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the httpd parent); User nobody"
    need_cell apache2
    mkdir -p www && ln -sf "$DATA" www/data.bin
    cat > httpd.conf <<CONF
ServerRoot /etc/apache2
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
Listen $A:$PORT
ServerName rsock-test
User nobody
Group nogroup
PidFile $CELL_DIR/httpd.pid
ErrorLog $CELL_DIR/httpd-error.log
DocumentRoot $CELL_DIR/www
Mutex file:$CELL_DIR default
# Spare children are never reaped during the cell: the parent wakes one to exit with a
# request to itself, which the counters would show as traffic.
StartServers 2
MinSpareServers 1
MaxSpareServers 16
<Directory $CELL_DIR/www>
    Require all granted
</Directory>
CONF
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" apache2 -f "$CELL_DIR/httpd.conf" -DFOREGROUND
    wait_dual srv
    wait_until 30 test -s httpd.pid || fail "httpd wrote no pid file: $(tail -c 300 httpd-error.log)"
    local main
    main=$(cat httpd.pid)
    echo "# child users: $(ps -o user= --ppid "$main" | sort | uniq -c | paste -sd' ')"
    HTTP_STOP() { kill -TERM "$main" 2>/dev/null; bg_wait srv; }
    http_round "$main"
    local e
    e=$(grep -E '\[[a-z_]*:(alert|crit|emerg|error)\]' httpd-error.log | head -n 3 | paste -sd'|')
    [ -z "$e" ] || soft fail "httpd error log: $e"
}

# gunicorn, 3 sync workers that drop to nobody (`--user`), a WSGI app serving the file.
cell_gunicorn_user() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the gunicorn arbiter); --user nobody"
    need_cell gunicorn
    cat > app.py <<PY
DATA = open("$DATA", "rb").read()
def app(environ, start_response):
    start_response("200 OK", [("Content-Length", str(len(DATA))), ("Content-Type", "application/octet-stream")])
    return [DATA]
PY
    chmod 644 app.py
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" gunicorn --chdir "$CELL_DIR" --user nobody --group nogroup -w 3 \
        -b "$A:$PORT" --pid "$CELL_DIR/gunicorn.pid" --worker-tmp-dir /dev/shm app:app
    wait_dual srv
    wait_until 30 test -s gunicorn.pid || fail "gunicorn wrote no pid file: $(tail -c 300 srv.err)"
    local main
    main=$(cat gunicorn.pid)
    wait_until 60 test "$(ps -o pid= --ppid "$main" | wc -l)" -ge 3 || fail "gunicorn started no 3 workers"
    echo "# worker users: $(ps -o user= --ppid "$main" | sort | uniq -c | paste -sd' ')"
    HTTP_STOP() { kill -TERM "$main" 2>/dev/null; bg_wait srv; }
    http_round "$main"
}

# rsync daemon as root with its defaults (uid nobody, gid nogroup, use chroot): it forks per
# connection and the child chroots and drops root; 3 shimmed clients fetch the file. The
# child reads the client's greeting, so takes its connection over, before it drops root:
# then it gives the connection back to the daemon, which relays it (src/api/creds.rs).
# Once opt-in (data through in 3 of 4 runs): two daemon children that gave their connections
# back while the daemon's helper was busy taking a third one back never got their bytes
# (rsyncd's "daemon handshake timeout"). The daemon now takes streams back on its mover
# threads, and its helper keeps relaying (3 of 3 runs after, 2026-11-25).
cell_rsyncd() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the daemon)"
    need_cell rsync
    mkdir -p mod && cp "$DATA" mod/data.bin && chmod 755 mod && chmod 644 mod/data.bin
    cat > rsyncd.conf <<CONF
pid file = $CELL_DIR/rsyncd.pid
log file = $CELL_DIR/rsyncd.log
[data]
    path = $CELL_DIR/mod
    read only = yes
CONF
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" rsync --daemon --no-detach --config="$CELL_DIR/rsyncd.conf" \
        --address="$A" --port="$PORT"
    wait_dual srv
    wait_until 30 test -s rsyncd.pid || fail "rsyncd wrote no pid file"
    local main i
    main=$(cat rsyncd.pid)
    for i in 1 2 3; do
        bg "cli$i" $T shimmed "$CELL_DIR/cli" rsync --bwlimit=2048 "rsync://$A:$PORT/data/data.bin" "$CELL_DIR/got$i.bin"
    done
    local bad=() rc
    for i in 1 2 3; do
        rc=0; bg_wait "cli$i" || rc=$?
        [ $rc -eq 0 ] || bad+=("cli$i: status $rc $(tail -c 150 "cli$i.err" | paste -sd' ')")
    done
    bg_stop qps
    soft qp_check "$main" 1 1
    kill -TERM "$main" 2>/dev/null; bg_wait srv
    [ ${#bad[@]} -eq 0 ] || fail "rsync failed: ${bad[*]}"
    for i in 1 2 3; do soft expect_same_file "$DATA" "got$i.bin" "rsync $i"; done
    soft expect_stats "$CELL_DIR/cli" cli -D S="$SIZE" 'conns.rdma>=3' 'conns.tcp==0' 'rx.rdma>=3*S'
    soft expect_stats "$CELL_DIR/srv" srv 'conns.rdma>=3' 'conns.tcp==0'
    local back
    back=$(grep -c 'given back to pid' srv.log)
    echo "# connections given back before a credential change: $back"
    [ "$back" -eq 3 ] || soft fail "$back of 3 connections were given back to the daemon before its children dropped root"
    procs srv
    soft rdma_end "$((3 * SIZE))" 2
    expect_qps_released
}

# ---- 6. PostgreSQL + pgbench ---------------------------------------------------------------------

cell_postgres_pgbench() {
    echo "# EXPECT_QP_OWNER=$(owner_of "$CUR_CELL") (parent = the postmaster)"
    need_cell pgbench psql
    [ -x "$PGBIN/postgres" ] || fail "no PostgreSQL server binaries (scripts/setup.sh installs postgresql)"
    chmod 755 "$CELL_DIR"
    mkdir -p srv && touch srv.log && chown postgres: srv srv.log
    pg_init "$CELL_DIR/pg" || fail "initdb failed: $(tail -c 300 pg/initdb.out)"
    rdma_begin
    # shellcheck disable=SC2046 # pg_server_args prints words
    bg srv $T shimmed "$CELL_DIR/srv" setpriv --reuid=postgres --regid=postgres --init-groups \
        "$PGBIN/postgres" $(pg_server_args "$CELL_DIR/pg" "$A" "$PORT")
    wait_dual srv
    local main
    main=$(head -n1 pg/data/postmaster.pid)
    local PG=(-h "$A" -p "$PORT" -U postgres)
    timeout 200 env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$CELL_DIR/cli" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$CTO \
        RSOCK_LOG="$CELL_DIR/cli.log" pgbench -i -s 1 "${PG[@]}" postgres > init.out 2>&1 ||
        fail "pgbench -i failed: $(tail -c 400 init.out | paste -sd' ')"
    local rc=0
    timeout 200 env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$CELL_DIR/cli" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$CTO \
        RSOCK_LOG="$CELL_DIR/cli.log" pgbench -c 4 -j 2 -T 10 "${PG[@]}" postgres > bench.out 2>&1 || rc=$?
    bg_stop qps
    soft qp_check "$main" 1 1
    grep -E '^(number of (failed )?transactions|tps|latency average)' bench.out | sed 's/^/# pgbench: /'
    [ $rc -eq 0 ] || fail "pgbench -c 4 -T 10 exited $rc: $(tail -c 400 bench.out | paste -sd' ')"
    local done failed count
    done=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' bench.out)
    failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' bench.out)
    [ "${done:-0}" -gt 0 ] || soft fail "pgbench processed no transaction"
    [ "${failed:-x}" = 0 ] || soft fail "pgbench: ${failed:-unknown} failed transactions"
    count=$(timeout 60 env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$CELL_DIR/cli" RSOCK_STATS_KEEP=1 \
        RSOCK_CONNECT_TIMEOUT_MS=$CTO psql "${PG[@]}" -Atc 'select count(*) from pgbench_accounts' postgres 2>psql.err)
    echo "# pgbench_accounts rows: ${count:-none}"
    [ "$count" = 100000 ] || soft fail "pgbench_accounts has '${count:-?}' rows, want 100000: $(head -c 200 psql.err)"
    bg_stop srv
    # Client-side totals, then the server's must match them byte for byte.
    stats_json "$CELL_DIR/cli" stats.cli.tot.json
    CLI_TX=$(python3 -c 'import json,sys; print(sum(json.loads(l)["tx"]["rdma"] for l in open(sys.argv[1]) if l.strip()))' stats.cli.tot.json)
    CLI_RX=$(python3 -c 'import json,sys; print(sum(json.loads(l)["rx"]["rdma"] for l in open(sys.argv[1]) if l.strip()))' stats.cli.tot.json)
    local K
    K=$(python3 -c 'import json,sys; print(sum(json.loads(l)["conns"]["rdma"] for l in open(sys.argv[1]) if l.strip()))' stats.cli.tot.json)
    echo "# client side: $K RDMA connections, tx $CLI_TX rx $CLI_RX"
    soft expect_stats "$CELL_DIR/cli" cli 'nproc==3' 'conns.rdma>=6' 'conns.tcp==0' 'tx.tcp==0' 'rx.tcp==0'
    procs cli
    soft server_stats "$K"
    soft rdma_end "$CLI_TX" 2
    expect_qps_released
}

# ---- run --------------------------------------------------------------------------------------------
# Cells run only when named (CELLS=...), with why in their comment.
OPT_IN=()

CELL_LIST=(
    prefork_blocking prefork_epoll prefork_relay prefork_redirect prefork_redirect_blocking
    prefork_redirect_setuid prefork_redirect_busy prefork_redirect_skip_busy prefork_banner
    master_leaves_exec master_leaves_exit haproxy_packaged haproxy_nochroot sshd_packaged
    dovecot_packaged samba_packaged
    fork_echo_plain fork_echo_relay fork_echo_data_before_fork fork_echo_shared fork_echo_sinksrc
    fork_echo_daemon fork_echo_daemon_first fork_echo_setuid fork_echo_raw_clone
    fork_echo_stdin_locked
    python_forking python_client_control subprocess_during_transfer children_then_parent
    drop_caps_capset drop_caps_syscall drop_caps_prctl
    socat_exec socat_exec_plain socat_exec_nofork socat_exec_nofork_plain
    ncat_sh_exec ncat_sh_exec_plain
    nginx_accept_mutex nginx_epollexclusive nginx_reuseport nginx_www_data nginx_redirect
    apache_prefork gunicorn_user rsyncd
    postgres_pgbench
)

cg_init
res_summary > "$T_WORK/res.start"
echo "# /tmp: $(df -h /tmp | awk 'NR == 2 { print $4 " free of " $2 }')"
t0=$SECONDS
for c in "${CELL_LIST[@]}" "${OPT_IN[@]}"; do
    if [[ " ${OPT_IN[*]} " == *" $c "* ]]; then
        [ -n "$PATTERN" ] && selected "$c" || { echo "# not run (opt-in, see its comment): $c"; continue; }
    else
        selected "$c" || continue
    fi
    CUR_CELL=$c
    run_cell "$c" in_cgroup
    cg_sweep "$c"
done
CUR_CELL=leaks
run_cell leaks
echo "# matrix took $((SECONDS - t0))s (work dir $T_WORK)"
[ "$T_FAIL" -eq 0 ] || echo "# logs of failed cells: $KEEP_DIR"
[ -n "$CG" ] && rmdir "$CG" 2>/dev/null
t_summary
