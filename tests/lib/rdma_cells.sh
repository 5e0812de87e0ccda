# shellcheck shell=bash
# Helpers of the RDMA test matrices (tests/rdma/shim_matrix.sh, tests/rdma/fork_matrix.sh),
# sourced after tests/rdma-vm/lib.sh and tests/lib/common.sh, inside the test-bed guest.
#
# The suite sets before use:
#   T      per-process bound in seconds          CTO   RSOCK_CONNECT_TIMEOUT_MS of every shimmed process
#   MTU    rxe0's active_mtu                     MUT   1 = assertion self-test (T_MUTATE), else 0
#   PATTERN  cell filter ("a,b": cells whose name contains a or b; empty: all)
#   KEEP_DIR where failed cells' directories are copied
#
# Cells and processes:
#   shimmed DIR CMD...        CMD under the shim: stats in DIR (kept), log DIR.log, the
#                             connect timeout; SHIM_LOG_LEVEL (default info)
#   wait_dual SRVNAME         the shimmed server listens on kernel TCP and rdma_cm
#   run_cell NAME             t_cell NAME cell_NAME, then the cell's notes or its log tail
#   selected NAME             NAME matches PATTERN
# Device evidence:
#   rdma_begin                snapshot rxe0's counters; sample the RC QPs every QP_SAMPLE_S
#                             (default 0.5) s: count per sample in qps.out, full lines in
#                             qps.log ("@<time>" before each sample; each line ends with
#                             "tgid N ppid M": the process of the thread `rdma` lists as
#                             "pid", and its parent; "?" once the thread has gone)
#   rdma_end BYTES MIN_QPS [MIN_RECVS]  stop the sampler; fail unless MIN_QPS RC QPs were
#                             seen at once, rxe0 sent at least BYTES/MTU packets and (if
#                             given) consumed at least MIN_RECVS receives (rdma_recvs: one
#                             per WRITE_WITH_IMM, so per message, however short-lived the QPs)
#   expect_qps_released [S]   no RC QP left (within S s, default 30)
#   res_summary, cell_leaks   rxe0's resource totals; the leaks cell (needs res.start)
# Idle waiters:
#   idle_waiters [VAR=VALUE]...  an echo server and three silent clients: CPU and the
#                             helpers' wake-ups while idle (below)
# Counters:
#   expect_rdma SIDE N [-D K=V]... [EXPR...]   stats of SIDE: N RDMA conns, nothing on TCP
#   reasons SIDE              prints SIDE's non-zero conns and fallback reasons

# Every shimmed process gets the connect timeout and its own log next to its stats dir.
_cmd() {
    if [ "$1" = shimmed ]; then
        T_CMD=(env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$2" RSOCK_STATS_KEEP=1
            RSOCK_CONNECT_TIMEOUT_MS=$CTO RSOCK_LOG="$2.log" RSOCK_LOG_LEVEL="${SHIM_LOG_LEVEL:-info}" "${@:3}")
    else
        T_CMD=("$@")
    fi
}
shimmed() {
    local dir=$1; shift
    env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$dir" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$CTO \
        RSOCK_LOG="$dir.log" RSOCK_LOG_LEVEL="${SHIM_LOG_LEVEL:-info}" "$@"
}

# ---- idle waiters ---------------------------------------------------------------------------

# cpu_ticks PID: user + system clock ticks of every thread of PID.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# helper_wakes PID: how often PID's helper thread (rsock-engine) went to sleep.
helper_wakes() {
    local t
    for t in /proc/"$1"/task/*; do
        if [ "$(cat "$t/comm" 2>/dev/null)" = rsock-engine ]; then
            awk '$1 == "voluntary_ctxt_switches:" { print $2 }' "$t/status"
            return
        fi
    done
    echo 0
}

# idle_waiters [VAR=VALUE]...: examples/echo_server (bg srv) and three clients of it (bg
# cli_recv, cli_epoll, cli_poll; tests/lib/idle_waiter.py) that wait on their silent
# connections after one echo — in a blocking recv, in epoll, in poll — all four shimmed
# with the VARs. Over 5 s of idleness each process uses at most 1 % of a CPU, and each
# one's helper thread wakes at most 100 times (its safety nets; a server's helper looked at
# idle link streams every 2 ms until 2026-11-29, about 2,600 times). Stops them all.
idle_waiters() {
    local modes=(recv epoll poll) m hz limit secs=5 wakes=100 i d w
    local before=() after=() wb=() wa=() pids=() names=() report=() over=()
    hz=$(getconf CLK_TCK)
    limit=$((hz * secs / 100)) # 1 % of the window
    bg srv $T shimmed "$CELL_DIR/srv" "$@" "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    for m in "${modes[@]}"; do
        bg "cli_$m" 120 shimmed "$CELL_DIR/cli_$m" "$@" python3 "$T_LIB_DIR/idle_waiter.py" "$A" "$PORT" "$m"
    done
    for m in "${modes[@]}"; do
        wait_until 60 grep -q '^ready' "$CELL_DIR/cli_$m.out" ||
            fail "the $m waiter got no echo: $(tail -c 300 "$CELL_DIR/cli_$m.err" | paste -sd' ')"
        pids+=("$(pgrep -P "$(bg_pid "cli_$m")" | head -n1)") names+=("$m")
    done
    pids+=("$(pgrep -P "$(bg_pid srv)" | head -n1)") names+=(server)
    sleep 1 # past the last spin
    for i in "${!pids[@]}"; do before+=("$(cpu_ticks "${pids[i]}")") wb+=("$(helper_wakes "${pids[i]}")"); done
    sleep $secs
    for i in "${!pids[@]}"; do after+=("$(cpu_ticks "${pids[i]}")") wa+=("$(helper_wakes "${pids[i]}")"); done
    for i in "${!pids[@]}"; do
        d=$((after[i] - before[i])) w=$((wa[i] - wb[i]))
        report+=("${names[i]} $d/$w")
        [ "$MUT" = 1 ] && d=$((d + limit + 1))
        [ "$d" -le "$limit" ] || over+=("${names[i]} (pid ${pids[i]}) used $d ticks of 1/$hz s, want <= $limit (1 %)")
        [ "$w" -le "$wakes" ] || over+=("${names[i]}'s helper woke $w times, want <= $wakes")
    done
    echo "# while idle for ${secs}s, CPU ticks of 1/$hz s / helper wake-ups: ${report[*]}"
    for m in "${modes[@]}"; do bg_stop "cli_$m"; done
    bg_stop srv
    [ ${#over[@]} -eq 0 ] || fail "while idle for ${secs}s: $(IFS=';'; echo "${over[*]}")"
}

# ---- device evidence ------------------------------------------------------------------------

# RC QPs of the whole device (GSI/UD are not ours).
rc_qps() { rdma resource show qp 2>/dev/null | grep -c ' type RC ' || true; }
no_rc_qps() { [ "$(rc_qps)" -eq 0 ]; }
rc_qps_left() { [ "$(rc_qps)" -gt 0 ]; }

rdma_begin() {
    rxe_counters_snapshot "$CELL_DIR/rxe.before"
    # Two programs started per sample (rdma, sleep): under emulation each start costs
    # tens of ms, and one that started five took ~3 s a round while a transfer took 2 s
    # (a cell then saw no server QP at all, 2026-11-29).
    bg qps 900 bash -c 'while :; do
        rc=()
        while IFS= read -r l; do
            [[ $l == *" type RC "* ]] || continue
            # "pid" is the creating thread: add its process (tgid) while it still exists.
            p=${l##* pid }; p=${p%% *}; g="?" pp="?"
            while read -r k v; do case $k in Tgid:) g=$v ;; PPid:) pp=$v; break ;; esac
            done 2>/dev/null < "/proc/$p/status"
            rc+=("$l tgid $g ppid $pp")
        done < <(rdma resource show qp 2>/dev/null)
        [ ${#rc[@]} -eq 0 ] || { printf "@%s\n" "$EPOCHREALTIME"; printf "%s\n" "${rc[@]}"; } >> qps.log 2>/dev/null
        echo ${#rc[@]}
        sleep "$0"; done' "${QP_SAMPLE_S:-0.5}"
}

rdma_end() {
    local bytes=$1 minqp=$2 minrecvs=${3:-0} maxqp sent want recvs
    [ "$MUT" = 1 ] && bytes=$((bytes * 100 + 100 * MTU)) minqp=$((minqp + 100)) minrecvs=$((minrecvs * 100 + 100))
    bg_stop qps
    maxqp=$(sort -n qps.out 2>/dev/null | tail -n1)
    rxe_counters_delta rxe.before > rxe.delta
    # In how many samples: a cell whose QPs show in one or two is a transfer that a faster
    # machine may finish between two samples (CI did, 2026-11-29).
    echo "# device: max RC QPs seen $maxqp (in $(awk -v m="$minqp" '$1 >= m' qps.out 2>/dev/null | wc -l)" \
        "of $(wc -l < qps.out 2>/dev/null || echo 0) samples); rxe0 deltas: $(paste -sd' ' rxe.delta)"
    local why=()
    [ "${maxqp:-0}" -ge "$minqp" ] || why+=("device: at most ${maxqp:-0} RC QPs seen during the transfer, want >= $minqp")
    sent=$(awk '$1 == "sent_pkts" { print $2 }' rxe.delta)
    want=$(( bytes / MTU ))
    [ "${sent:-0}" -ge "$want" ] || why+=("device: rxe0 sent_pkts +${sent:-0}, want >= $want (bytes $bytes / active_mtu $MTU)")
    recvs=$(awk '$1 == "rdma_recvs" { print $2 }' rxe.delta)
    [ "${recvs:-0}" -ge "$minrecvs" ] || why+=("device: rxe0 rdma_recvs +${recvs:-0}, want >= $minrecvs")
    [ ${#why[@]} -eq 0 ] || fail "$(IFS=';'; echo "${why[*]}")"
}

expect_qps_released() {
    if [ "$MUT" = 1 ]; then
        wait_until 5 rc_qps_left && return 0
        fail "mutation: expected RC QPs to remain, $(rc_qps) listed"
    fi
    wait_until "${1:-30}" no_rc_qps && return 0
    rdma resource show qp > qps.left 2>&1
    fail "$(rc_qps) RC QP(s) still listed ${1:-30}s after the programs exited: $(grep ' type RC ' qps.left | head -3 | paste -sd'|')"
}

# `rdma resource show` summary numbers (pd cq qp cm_id mr ctx ...) as "name value" lines.
res_summary() {
    rdma resource show 2>/dev/null | awk '$2 == "rxe0:" { for (i = 3; i < NF; i += 2) print $i, $(i + 1) }'
}

# The leaks cell: nothing left on rxe0 compared with $T_WORK/res.start (res_summary at start).
cell_leaks() {
    res_summary > now.txt
    echo "# at start: $(paste -sd' ' "$T_WORK/res.start")"
    echo "# now:      $(paste -sd' ' now.txt)"
    wait_until 30 no_rc_qps || fail "RC QPs left: $(rdma resource show qp | grep ' type RC ' | head -5 | paste -sd'|')"
    local mrs
    mrs=$(rdma resource show mr 2>/dev/null | grep -c 'mrn' || true)
    [ "$mrs" -eq 0 ] || fail "$mrs MR(s) left: $(rdma resource show mr | head -3 | paste -sd'|')"
    local name v start
    while read -r name v; do
        start=$(awk -v n="$name" '$1 == n { print $2 }' "$T_WORK/res.start")
        [ "$v" -le "${start:-0}" ] || fail "rxe0 $name: $v now, ${start:-0} at the start of the matrix"
    done < now.txt
    local ids
    ids=$(rdma resource show cm_id 2>/dev/null | grep -c 'cm-idn' || true)
    [ "$ids" -eq 0 ] || fail "$ids cm_id(s) left: $(rdma resource show cm_id | head -3 | paste -sd'|')"
}

# ---- counters ---------------------------------------------------------------------------------

expect_rdma() {
    local side=$1 n=$2 defs=(); shift 2
    while [ "${1:-}" = -D ]; do defs+=(-D "$2"); shift 2; done
    [ "$MUT" = 1 ] && n=$((n + 1))
    expect_stats "$CELL_DIR/$side" "$side" -D N="$n" "${defs[@]}" 'nproc>=1' 'conns.rdma==N' 'conns.tcp==0' \
        'tx.tcp==0' 'rx.tcp==0' "$@"
}

reasons() {
    echo "# $1: conns $(json_get "stats.$1.json" '{k: v for k, v in j["conns"].items() if v}' 2>/dev/null)" \
        "fallback $(json_get "stats.$1.json" '{k: v for k, v in j["fallback"].items() if v}' 2>/dev/null)"
}

wait_dual() {
    wait_listen "$PORT" 60 "$1" || fail "server did not listen on TCP $PORT$(bg_alive "$1" ||
        echo " (it exited: $(tail -c 300 "$CELL_DIR/$1.err" 2>/dev/null | paste -sd' '))")"
    wait_rdma_listen "$PORT" 60 || fail "server listens on TCP but not on rdma_cm port $PORT (dual listen)"
}

# ---- running cells ------------------------------------------------------------------------------

# keep_logs NAME: copies a failed cell's directory (files up to 1 MiB) into the project.
keep_logs() {
    local src=$T_WORK/$1 dst=$KEEP_DIR/$1
    mkdir -p "$dst" && (cd "$src" && find . -type f -size -1025k -print0 | xargs -0r cp --parents -t "$dst") 2>/dev/null
}

# run_cell NAME [FUNCTION]: FUNCTION defaults to cell_NAME.
run_cell() {
    local before=$T_FAIL t0=$SECONDS
    t_cell "$1" "${2:-cell_$1}"
    if [ "$T_FAIL" -gt "$before" ]; then
        echo "    # failed after $((SECONDS - t0))s"
        keep_logs "$1"
        tail -n 15 "$T_WORK/$1/cell.log" | sed 's/^/    | /'
    else
        grep '^# ' "$T_WORK/$1/cell.log" | sed 's/^/    /'
    fi
    # The guest's /tmp is a small tmpfs: drop the cell's big files (received data).
    find "$T_WORK/$1" -type f -size +1024k -delete 2>/dev/null
}

selected() {
    local p
    [ -z "$PATTERN" ] && return 0
    for p in ${PATTERN//,/ }; do [[ $1 == *$p* ]] && return 0; done
    return 1
}
