#!/usr/bin/env bash
# Isolation between the connections of one rsock process (issue #11), in the Soft-RoCE guest.
# A hostile peer (tests/programs/attacker.rs, example rsock_attacker) talks rsock's handshake
# at the verbs level to an rsock echo server, learns the rings (address, rkey) of its own
# connections from their Accept hellos, and RDMA-WRITEs into one connection's ring through
# another connection's QP, then guesses around it from fresh connections. Meanwhile a
# legitimate client streams a file through the same server.
#
#   cargo build --release --workspace --examples
#   tests/rdma-vm/run.sh -- tests/rdma/isolation.sh [PATTERN[,PATTERN...]]
#
# Cell isolation_cross_connection_write asserts:
#   (a) the victim's data comes back intact (sha256);
#   (b) the attacker exits 0: at least one cross-connection write attempted, none succeeded
#       (each must complete with an error on the attacker's QP; expected: remote access
#       error) — its sanity writes into its own rings, through their own QPs, succeed;
#   (c) the server served the victim over RDMA (the shim's counters);
#   (d) the server is alive after the attack and serves a new connection; the victim's and
#       the new connection's lines in its log say result=ok;
#   and no RC QP is left once every connection ended (the server still running).
# Cell isolation_hostile_migrate: a peer says its end moves (MIGRATE, PROTOCOL.md §11) to a
# port where nothing listens, and stays connected. The server's shim must try the resume,
# fail, and end that connection with an error within 30 s (not wait for ever); a connection
# made meanwhile echoes intact; the server stays up and ends with no QP left.
# Cell isolation_phantom_read (issue #21): a victim streams a recognisable random 12 KiB
# through the echo server and leaves (the server's 16 KiB ring goes back to its pool); then
# the attacker connects — getting that ring — and announces a full ring of DATA with a
# zero-length WRITE_WITH_IMM (rsock_attacker --phantom-read). Asserts: the attacker gets
# none of the victim's bytes back (no 16-byte block of the victim's file in what it
# received); the server's shim drops the attacker's connection and its log says the length
# mismatch; the server then serves a new client (sha256) and ends with no QP left. On a
# shim that trusts the announced length and reuses rings uncleared, the attacker receives
# the victim's bytes and the cell fails.
# Environment: T_ISO_MB (victim's file, MiB, default 16), SHIM_LOG_LEVEL, T_KEEP=1.
#
# Prints "PASS cell (Ns)" / "FAIL cell: why", then "N passed, N failed"; exit 1 on failure.

set -u
# shellcheck source=../lib/rdma_suite.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/rdma_suite.sh"
need nc.openbsd python3 ss timeout sha256sum rdma ibv_devinfo
PATTERN=${1:-}
MB=${T_ISO_MB:-16}
MUT=0
A=$RDMA_VM_ADDR
NC=nc.openbsd
EX=$T_EXAMPLES
T=300     # per-process bound, seconds
CTO=5000  # RSOCK_CONNECT_TIMEOUT_MS: the default 500 ms is too short under TCG
RUN_ID=$(date -u +%Y%m%dT%H%M%S)
KEEP_DIR=$T_ROOT/.cache/rdma-matrix-logs/isolation-$RUN_ID
ulimit -l unlimited 2>/dev/null || true
MTU=$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
MTU=${MTU:-1024}
for x in echo_server rsock_attacker; do
    [ -x "$EX/$x" ] || { echo "missing $EX/$x (cargo build --release --examples)" >&2; exit 2; }
done
DATA=$T_WORK/data.bin
make_random "$DATA" "$MB"
SIZE=$(stat -c %s "$DATA")
DATA2=$T_WORK/data2.bin
make_random "$DATA2" 1

# The victim's input: a quarter of DATA at once, then 64 KiB every 0.1 s while the attack
# runs (up to three quarters), then, once the flag file exists (or after LIMIT s), the rest.
# Its connection thus stays open, with data moving through the server's ring for it, for as
# long as the attacker works.
PACER='import os, sys, time
fifo, data, flag, limit = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
buf = open(data, "rb").read()
out = open(fifo, "wb")
pos, n = 0, len(buf)
def send(k):
    global pos
    k = min(k, n - pos)
    out.write(buf[pos:pos + k]); out.flush(); pos += k
while pos < n // 4:
    send(256 * 1024)
end = time.time() + limit
while not os.path.exists(flag) and time.time() < end:
    if pos < 3 * n // 4:
        send(64 * 1024)
    time.sleep(0.1)
while pos < n:
    send(256 * 1024)
out.close()'

# status_soft NAME WANT: waits for background command NAME (in this shell: `soft` runs its
# check in a subshell, which cannot wait); records a failure unless it exits WANT.
status_soft() {
    local rc=0
    bg_wait "$1" || rc=$?
    [ "$rc" -eq "$2" ] || soft fail "$1 exited $rc, want $2$( [ "$rc" -eq 124 ] && echo ' (timed out)'): $(tail -c 300 "$CELL_DIR/$1.err" 2>/dev/null | paste -sd' ')"
}

cell_isolation_cross_connection_write() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    mkfifo victim.fifo
    bg pacer $T python3 -c "$PACER" victim.fifo "$DATA" attack.done 240
    bg_in victim $T victim.fifo shimmed "$CELL_DIR/victim" $NC -N "$A" "$PORT"
    # The victim is connected (over RDMA: 2 RC QPs) and its bytes come back.
    wait_cond 120 '[ -s victim.out ] && [ "$(rc_qps)" -ge 2 ]' ||
        fail "the victim did not start streaming: $(stat -c %s victim.out 2>/dev/null) bytes back, $(rc_qps) RC QPs; $(tail -c 300 victim.err 2>/dev/null | paste -sd' ')"
    echo "# victim streaming: $(stat -c %s victim.out) bytes back when the attack starts"

    local rc=0
    bg atk 240 "$EX/rsock_attacker" "$A" "$PORT" --timeout 20
    bg_wait atk || rc=$?
    : > attack.done
    sed 's/^/#   /' atk.out
    [ -s atk.err ] && echo "# attacker stderr: $(tail -c 300 atk.err | paste -sd' ')"
    local summary attempted succeeded
    summary=$(grep '^attacker: ' atk.out | tail -n1)
    attempted=$(sed -n 's/.* \([0-9][0-9]*\) attempted.*/\1/p' <<< "$summary")
    succeeded=$(sed -n 's/.* \([0-9][0-9]*\) succeeded.*/\1/p' <<< "$summary")
    if [ "$rc" -ne 0 ]; then
        local ok
        ok=$(grep 'kind=cross .*result=succeeded' atk.out | sed 's/.*name=\([^ ]*\) .*via=\([^ ]*\) .*rkey=\([^ ]*\) addr=\([^ ]*\) .*/\1(via \2 rkey \3 addr \4)/' | paste -sd' ')
        soft fail "attacker exited $rc$( [ "$rc" -eq 124 ] && echo ' (timed out)'): ${summary:-no summary}${ok:+; cross-connection writes that succeeded: $ok}"
    fi
    [ "${attempted:-0}" -ge 1 ] || soft fail "attacker attempted no cross-connection write: ${summary:-no summary}"
    [ "${succeeded:-1}" -eq 0 ] || soft fail "attacker: ${succeeded:-?} cross-connection write(s) succeeded"

    # (d) The server survived and serves a new connection.
    bg_alive srv || fail "the echo server died during the attack: $(tail -c 300 srv.err | paste -sd' ')"
    bg_in after $T "$DATA2" shimmed "$CELL_DIR/after" $NC -N "$A" "$PORT"
    status_soft after 0
    soft expect_same_file "$DATA2" after.out "connection after the attack"

    # (a) The victim's stream came back intact.
    status_soft victim 0
    soft expect_same_file "$DATA" victim.out "victim"
    bg_alive srv || fail "the echo server died after the attack: $(tail -c 300 srv.err | paste -sd' ')"
    local v
    v=$(grep -c "bytes=$SIZE result=ok" srv.out || true)
    [ "$v" -ge 1 ] || soft fail "server log has no connection that echoed $SIZE bytes with result=ok: $(grep -v ' bytes=0 ' srv.out | head -3 | paste -sd'|')"
    echo "# server log: $(grep -c 'result=ok' srv.out) connections ok, $(grep -c 'result=error' srv.out) ended with an error"

    # (c) Counters: the victim and the new connection were on RDMA.
    soft rdma_end "$SIZE" 2
    soft expect_rdma victim 1 -D SIZE="$SIZE" 'nproc==1' 'tx.rdma==SIZE' 'rx.rdma==SIZE'
    soft expect_rdma after 1 'nproc==1'
    soft expect_stats "$CELL_DIR/srv" srv -D SIZE="$SIZE" 'nproc==1' 'alive==1' 'conns.rdma>=2' \
        'conns.tcp==0' 'rx.rdma>=SIZE' 'tx.rdma>=SIZE'
    reasons srv

    # Every connection has ended: the server (still running) holds no QP, nor does anyone.
    wait_until 30 no_rc_qps || soft fail "$(rc_qps) RC QP(s) still listed 30 s after every connection ended (server alive): $(rdma resource show qp | grep ' type RC ' | head -3 | paste -sd'|')"
    bg_stop srv
    expect_qps_released
}

cell_isolation_hostile_migrate() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    local rc=0
    bg atk 120 "$EX/rsock_attacker" "$A" "$PORT" --timeout 40 --migrate 9
    wait_cond 60 'grep -q "^attacker: " atk.out' || fail "the attacker did not get its MIGRATE out: $(tail -c 300 atk.err | paste -sd' ')"
    sed 's/^/#   /' atk.out
    grep -q '^attacker: MIGRATE to port 9 sent' atk.out || fail "MIGRATE not sent: $(tail -n1 atk.out)"
    # Meanwhile a legitimate connection is served.
    bg_in after $T "$DATA2" shimmed "$CELL_DIR/after" $NC -N "$A" "$PORT"
    status_soft after 0
    soft expect_same_file "$DATA2" after.out "connection made after the hostile MIGRATE"
    # The connection that sent MIGRATE ends with an error while its peer is still there.
    wait_cond 30 'grep -q "result=error" srv.out' ||
        soft fail "the server still waits on the connection that moved nowhere: $(paste -sd'|' srv.out)"
    bg_alive atk || soft fail "the attacker left before the server gave up (nothing proven)"
    echo "# server log: $(grep 'result=' srv.out | paste -sd'|')"
    grep -q 'resume after the peer moved' srv.log ||
        soft fail "the shim's log does not say why: $(grep -m3 -E 'WARN|moves|resum' srv.log | paste -sd'|')"
    grep -m1 'resume after the peer moved' srv.log | sed 's/^/# shim: /'
    bg_wait atk || rc=$?
    [ "$rc" -eq 0 ] || soft fail "attacker exited $rc: $(tail -n1 atk.out)"
    bg_alive srv || fail "the echo server died: $(tail -c 300 srv.err | paste -sd' ')"
    wait_until 30 no_rc_qps || soft fail "$(rc_qps) RC QP(s) still listed 30 s after every connection ended (server alive)"
    bg_stop srv
    expect_qps_released
}

# How many 16-byte blocks of VICTIM appear anywhere in GOT (the attacker's echo).
VICTIM_BLOCKS='import sys
v, g = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
blocks = {v[i:i + 16] for i in range(0, len(v) - 15, 16)}
print(sum(1 for i in range(len(g) - 15) if g[i:i + 16] in blocks))'

cell_isolation_phantom_read() {
    rdma_begin
    bg srv $T shimmed "$CELL_DIR/srv" "$EX/echo_server" "$A:$PORT"
    wait_dual srv
    # Less than the server's first ring (16 KiB): the ring never grows, so it is pooled.
    head -c 12288 /dev/urandom > victim.bin
    bg_in victim $T victim.bin shimmed "$CELL_DIR/victim" $NC -N "$A" "$PORT"
    status_soft victim 0
    soft expect_same_file victim.bin victim.out "victim"
    wait_cond 60 'grep -q "bytes=12288 result=ok" srv.out' ||
        fail "the server did not finish the victim's connection: $(paste -sd'|' srv.out)"
    # Its QP is gone, so its ring is back in the server's pool.
    wait_until 60 no_rc_qps || fail "$(rc_qps) RC QP(s) left after the victim ended"

    local rc=0 got
    bg atk 120 "$EX/rsock_attacker" "$A" "$PORT" --timeout 20 --phantom-read phantom.bin
    bg_wait atk || rc=$?
    sed 's/^/#   /' atk.out
    [ -s atk.err ] && echo "# attacker stderr: $(tail -c 300 atk.err | paste -sd' ')"
    grep -q '^phantom: ' atk.out || fail "the attack was not made (exit $rc): $(tail -n1 atk.out)"
    got=$(python3 -c "$VICTIM_BLOCKS" victim.bin phantom.bin)
    [ "$got" -eq 0 ] || soft fail "the attacker received $got 16-byte block(s) of the victim's bytes"
    [ "$rc" -eq 0 ] || soft fail "attacker exited $rc: the server echoed bytes it never sent: $(tail -n1 atk.out)"
    grep -qE 'ended=(disconnected|reset)' atk.out ||
        soft fail "the server did not drop the attacker's connection: $(tail -n1 atk.out)"
    grep -q 'length mismatch' srv.log ||
        soft fail "the shim's log does not say why: $(grep -m3 -E 'WARN|protocol' srv.log | paste -sd'|')"
    grep -m1 'length mismatch' srv.log | sed 's/^/# shim: /'

    # The server goes on serving.
    bg_alive srv || fail "the echo server died: $(tail -c 300 srv.err | paste -sd' ')"
    bg_in after $T "$DATA2" shimmed "$CELL_DIR/after" $NC -N "$A" "$PORT"
    status_soft after 0
    soft expect_same_file "$DATA2" after.out "connection after the phantom read"
    soft expect_rdma victim 1 'nproc==1'
    soft expect_rdma after 1 'nproc==1'
    echo "# server log: $(grep 'result=' srv.out | paste -sd'|')"
    wait_until 30 no_rc_qps || soft fail "$(rc_qps) RC QP(s) still listed 30 s after every connection ended (server alive)"
    bg_stop srv
    expect_qps_released
}

CELLS=(isolation_cross_connection_write isolation_hostile_migrate isolation_phantom_read)
for c in "${CELLS[@]}"; do
    selected "$c" && run_cell "$c"
done
t_summary
