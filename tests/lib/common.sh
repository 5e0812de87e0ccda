# Shared helpers for rsock's shell test suites (passthrough matrix, RDMA suites).
# Source it from bash:  . "$(dirname "$0")/../lib/common.sh"
#
# Needs: bash, coreutils (timeout, sha256sum, head), iproute2 (ss), python3.
#
# Conventions
#   - A suite calls `t_init` once, then `t_cell NAME FUNCTION` per cell, then `t_summary`.
#   - Each cell runs FUNCTION in a subshell, in its own directory $CELL_DIR, with its own
#     free TCP port $PORT (and $PORT2 for a second one). It fails by calling `fail "why"`
#     (or by returning non-zero: the reason is then "exit status N").
#   - Background processes must be started with `bg NAME DURATION cmd...`: each runs under
#     `timeout`, its pid is recorded, and whatever is still running when the cell ends is
#     killed. `bg_wait NAME` waits for one and returns its exit status.
#   - `shimmed DIR cmd...` runs cmd with the shim preloaded, counting into stats dir DIR
#     (kept after exit). `expect_stats DIR LABEL EXPR...` asserts on those counters.

T_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
T_ROOT=$(cd "$T_LIB_DIR/../.." && pwd)

# ---- setup -------------------------------------------------------------------------------

# t_init: resolves the shim and CLI, makes the work dir, strips RSOCK_* from the environment
# (the shim warns about unknown RSOCK_* variables, and tests set exactly what they mean to).
t_init() {
    T_SO=$(readlink -f "${RSOCK_SO:-$T_ROOT/target/release/librsock.so}")
    T_BIN=$(readlink -f "${RSOCK_BIN:-$T_ROOT/target/release/rsock}")
    T_EXAMPLES=${RSOCK_EXAMPLES:-$T_ROOT/target/release/examples}
    local v
    for v in $(compgen -e | grep '^RSOCK_'); do unset "$v"; done
    [ -f "$T_SO" ] || { echo "shim not found: $T_SO (cargo build --release)" >&2; exit 2; }
    [ -x "$T_BIN" ] || { echo "rsock CLI not found: $T_BIN (cargo build --release)" >&2; exit 2; }
    T_WORK=$(mktemp -d "${TMPDIR:-/tmp}/rsock-test.XXXXXX")
    T_PASS=0 T_FAIL=0 T_FAILED=()
    T_NEXT_PORT=$(( 20000 + (RANDOM % 2000) * 10 ))
    T_KEEP=${T_KEEP:-0}
    trap 't_cleanup_all' EXIT
    trap 'exit 130' INT TERM
}

t_cleanup_all() {
    if [ "$T_KEEP" != 1 ] && [ "$T_FAIL" -eq 0 ]; then rm -rf "$T_WORK"; fi
}

# need CMD...: exits the suite (status 2) if a required program is missing.
need() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || { echo "missing required program: $c" >&2; exit 2; }
    done
}

# port_free PORT: true if nothing listens on or uses PORT locally.
port_free() {
    [ -z "$(ss -Hant "( sport = :$1 or dport = :$1 )" 2>/dev/null)" ]
}

# alloc_port VAR: sets VAR to a free port (unique within the suite run).
alloc_port() {
    while ! port_free "$T_NEXT_PORT"; do T_NEXT_PORT=$((T_NEXT_PORT + 1)); done
    printf -v "$1" '%s' "$T_NEXT_PORT"
    T_NEXT_PORT=$((T_NEXT_PORT + 1))
}

# make_random FILE MB: a file of MB MiB of random bytes (made once; reused if present).
make_random() {
    [ -s "$1" ] && [ "$(stat -c %s "$1")" -eq $(( $2 * 1048576 )) ] && return 0
    head -c "$(( $2 * 1048576 ))" /dev/urandom > "$1"
}

# ---- cells -------------------------------------------------------------------------------

# fail WHY: ends the current cell as failed.
fail() {
    printf '%s\n' "$*" >> "$CELL_DIR/.why"
    exit 1
}

# soft CHECK...: runs one check (expect_*, or anything calling fail) without ending the
# cell on failure: the reason is recorded and the cell fails at its end. Lets a cell report
# every failed check, not just the first.
soft() {
    ( "$@" )
    return 0
}

# t_cell NAME FUNCTION [ARGS...]: runs one cell and prints PASS/FAIL.
t_cell() {
    local name=$1 fn=$2; shift 2
    CELL_DIR=$T_WORK/$name
    mkdir -p "$CELL_DIR"
    : > "$CELL_DIR/.pids"
    alloc_port PORT; alloc_port PORT2
    local t0=$SECONDS rc
    ( cd "$CELL_DIR" && set -o pipefail && "$fn" "$@" ) > "$CELL_DIR/cell.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && [ -s "$CELL_DIR/.why" ] && rc=1  # a `soft` check failed
    kill_cell_procs
    if [ $rc -eq 0 ]; then
        T_PASS=$((T_PASS + 1))
        echo "PASS $name ($((SECONDS - t0))s)"
    else
        T_FAIL=$((T_FAIL + 1)); T_FAILED+=("$name")
        local why
        why=$(paste -sd';' "$CELL_DIR/.why" 2>/dev/null)
        echo "FAIL $name: ${why:-exit status $rc} (log: $CELL_DIR/cell.log)"
    fi
}

# t_summary: prints "N passed, N failed" and returns non-zero if any failed.
t_summary() {
    if [ "$T_KEEP" = 1 ] || [ "$T_FAIL" -gt 0 ]; then echo "# work dir kept: $T_WORK"; fi
    echo "$T_PASS passed, $T_FAIL failed"
    [ "$T_FAIL" -eq 0 ]
}

# bg NAME SECS CMD...: starts CMD in the background under `timeout SECS`, output to
# $CELL_DIR/NAME.out / NAME.err. CMD may start with `shimmed STATSDIR` (see below).
bg() {
    local name=$1 secs=$2; shift 2
    _cmd "$@"
    timeout -k 2 "$secs" "${T_CMD[@]}" > "$CELL_DIR/$name.out" 2> "$CELL_DIR/$name.err" &
    _bg_started "$name" $!
}

# bg_in NAME SECS INFILE CMD...: like bg, with stdin from INFILE.
bg_in() {
    local name=$1 secs=$2 in=$3; shift 3
    _cmd "$@"
    timeout -k 2 "$secs" "${T_CMD[@]}" < "$in" > "$CELL_DIR/$name.out" 2> "$CELL_DIR/$name.err" &
    _bg_started "$name" $!
}

_bg_started() {
    echo "$1 $2" >> "$CELL_DIR/.pids"
    eval "BG_$1=$2"
}

# _cmd CMD...: sets T_CMD to CMD as an executable command line (expands a leading
# `shimmed DIR`, which is a shell function and cannot run under timeout as such).
_cmd() {
    if [ "$1" = shimmed ]; then
        T_CMD=(env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$2" RSOCK_STATS_KEEP=1 "${@:3}")
    else
        T_CMD=("$@")
    fi
}

# bg_pid NAME: the pid of the `timeout` wrapping background command NAME.
bg_pid() { eval "echo \${BG_$1}"; }

# bg_wait NAME: waits for background command NAME; returns its exit status (124 = timed out).
bg_wait() {
    local pid
    pid=$(bg_pid "$1")
    wait "$pid"
}

# bg_stop NAME: sends SIGTERM to background command NAME (via its timeout) and reaps it.
bg_stop() {
    local pid
    pid=$(bg_pid "$1")
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 0
}

# bg_alive NAME: true while background command NAME runs.
bg_alive() { kill -0 "$(bg_pid "$1")" 2>/dev/null; }

kill_cell_procs() {
    local name pid
    while read -r name pid; do
        kill -TERM "$pid" 2>/dev/null
    done < "$CELL_DIR/.pids"
    # timeout -k 2 escalates to KILL for its child; give it that long at most.
    local i
    for i in $(seq 30); do
        local any=0
        while read -r name pid; do kill -0 "$pid" 2>/dev/null && any=1; done < "$CELL_DIR/.pids"
        [ $any = 0 ] && return 0
        sleep 0.1
    done
    while read -r name pid; do kill -KILL "$pid" 2>/dev/null; done < "$CELL_DIR/.pids"
}

# wait_listen PORT [SECS] [BGNAME]: waits until a TCP listener is up on PORT (at most SECS,
# default 10); with BGNAME, gives up early if that background command has exited.
wait_listen() {
    local port=$1 secs=${2:-10} who=${3:-} end
    end=$(( $(date +%s%N) + secs * 1000000000 ))
    while [ "$(date +%s%N)" -lt "$end" ]; do
        [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && return 0
        if [ -n "$who" ] && ! bg_alive "$who"; then return 1; fi
        sleep 0.02
    done
    return 1
}

# ---- the shim ----------------------------------------------------------------------------

# shimmed STATSDIR CMD...: runs CMD with the shim preloaded, stats kept in STATSDIR.
# Extra RSOCK_* settings can be given as leading NAME=VALUE words of CMD (env syntax).
shimmed() {
    local dir=$1; shift
    env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$dir" RSOCK_STATS_KEEP=1 "$@"
}

# pair_shim DIR CMD...: as shimmed, for the two-host bed: stats in DIR, the log in DIR.log
# (level SHIM_LOG_LEVEL, default info), and a connect timeout for two slow emulated guests.
pair_shim() {
    local dir=$1; shift
    shimmed "$dir" RSOCK_CONNECT_TIMEOUT_MS=20000 RSOCK_LOG="$dir.log" \
        RSOCK_LOG_LEVEL="${SHIM_LOG_LEVEL:-info}" "$@"
}

# stats_json STATSDIR OUT: writes `rsock stat --all --json` for STATSDIR to OUT.
stats_json() {
    env -u LD_PRELOAD "$T_BIN" stat --dir "$1" --all --json > "$2"
}

# expect_stats STATSDIR LABEL EXPR...: fails the cell unless every EXPR holds for the
# counters in STATSDIR (see stats_check.py for the names). `-D NAME=VALUE` pairs may precede
# the expressions.
expect_stats() {
    local dir=$1 label=$2; shift 2
    local out="$CELL_DIR/stats.$label.json" msg
    stats_json "$dir" "$out" || fail "$label: rsock stat failed on $dir"
    msg=$(python3 "$T_LIB_DIR/stats_check.py" "$out" "$@") || fail "$label: $(echo "$msg" | paste -sd';')"
}

# expect_no_stats STATSDIR LABEL: fails the cell if STATSDIR holds any stats file.
expect_no_stats() {
    local files
    files=$(ls -A "$1" 2>/dev/null)
    [ -z "$files" ] || fail "$2: stats files created: $(echo "$files" | paste -sd' ')"
}

# ---- data --------------------------------------------------------------------------------

# sha_of FILE: prints FILE's sha256.
sha_of() { sha256sum < "$1" | cut -d' ' -f1; }

# expect_same_file EXPECTED ACTUAL [LABEL]: fails the cell unless both have the same sha256.
expect_same_file() {
    local a b
    [ -f "$2" ] || fail "${3:-data}: $2 missing"
    a=$(sha_of "$1"); b=$(sha_of "$2")
    [ "$a" = "$b" ] || fail "${3:-data}: sha256 differs: $(stat -c %s "$2") bytes ${b:0:12}..., want $(stat -c %s "$1") bytes ${a:0:12}..."
}

# expect_status NAME WANT: waits for background command NAME, fails unless it exits WANT.
expect_status() {
    local rc=0
    bg_wait "$1" || rc=$?
    [ "$rc" -eq "$2" ] || fail "$1 exited $rc, want $2$( [ "$rc" -eq 124 ] && echo ' (timed out)'): $(tail -c 300 "$CELL_DIR/$1.err" 2>/dev/null | paste -sd' ')"
}

# expect_empty FILE LABEL: fails unless FILE is empty.
expect_empty() {
    [ ! -s "$1" ] || fail "$2: not empty: $(head -c 300 "$1" | paste -sd' ')"
}

# json_get FILE PYEXPR: evaluates PYEXPR with `j` bound to FILE's parsed JSON; prints result.
json_get() {
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
