#!/usr/bin/env bash
# Fork after accept across two hosts (tests/rdma-vm/run.sh --topology pair): node 1 runs a
# fork-after-accept echo server (examples/fork_echo), node 0 its client (examples/fork_client,
# 3 connections in parallel, 4 MiB each, pausing mid-stream). Each child takes its connection
# over (docs/DESIGN.md, "Processes"): the peer on the other host resumes towards the child's
# new QP. Checked:
#   - the client: every connection echoed intact (the server's trailer carries the sha256 of
#     what it received; the client compares what came back byte for byte), on RDMA (its
#     counters), and its shim resumed once per connection towards another process;
#   - node 1: each connection was taken over by a child (the shim's log, per pid), and a
#     second after the last take-over (the clients pause mid-stream, connections open),
#     `rdma resource show qp` lists server QPs owned by those children only.
#
#   tests/rdma-vm/run.sh --topology pair --timeout 600 -- tests/rdma-pair/fork_takeover.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
# shellcheck source=../lib/common.sh
. tests/lib/common.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "FAIL fork_takeover: needs --topology pair"; exit 1; }
t_init
PORT=7310
K=3
EX=$T_EXAMPLES
for x in fork_echo fork_client; do
    [ -x "$EX/$x" ] || { echo "missing $EX/$x (cargo build --release --examples)" >&2; exit 2; }
done

if [ "$RDMA_VM_NODE" = 1 ]; then
    dir=$T_WORK/srv
    pair_shim "$dir" timeout 300 "$EX/fork_echo" "$RDMA_VM_SELF:$PORT" --max-conns $K --timeout 120 \
        --pidfile "$T_WORK/srv.pid" > "$T_WORK/srv.out" 2>&1 &
    srv=$!
    wait_tcp_listen "$PORT" 60 && wait_rdma_listen "$PORT" 60 || { echo "FAIL fork_takeover: server did not listen"; exit 1; }
    main=$(cat "$T_WORK/srv.pid")
    pair_signal fork-takeover-srv-up
    # Once every connection has been taken over (the clients are mid-stream or paused, the
    # connections open), sample who owns the server's QPs.
    taken() { [ "$(grep -c "taken over from pid $main " "$dir.log")" -ge $K ]; }
    wait_until 120 taken || echo "# node 1: not every connection was taken over within 120 s"
    sleep 1
    rdma resource show qp 2>/dev/null | grep ' type RC ' > "$T_WORK/qps.txt"
    pair_wait fork-takeover-done 300
    wait "$srv"
    rc=0
    bad() { echo "FAIL fork_takeover (node 1): $*"; rc=1; }
    # "rsock[PID:TID] INFO  rdma stream ...: taken over from pid MAIN in N us"
    takers=$(grep "taken over from pid $main " "$dir.log" | sed 's/.*rsock\[\([0-9]*\):.*/\1/' | sort -u | wc -l)
    echo "# node 1: $takers child process(es) took a connection over from $main: $(grep -o 'taken over from pid [0-9]* in [0-9]* us' "$dir.log" | awk '{ print $7 }' | paste -sd' ') us"
    [ "$takers" -eq $K ] || bad "$takers children took a connection over, want $K"
    sed 's/^/# qp: /' "$T_WORK/qps.txt"
    # "pid" is the creating thread: its process is what owns the QP.
    owners=$(for t in $(sed -n 's/.* pid \([0-9]*\) .*/\1/p' "$T_WORK/qps.txt"); do
        awk '/^Tgid:/ { print $2 }' "/proc/$t/status" 2>/dev/null || echo "$t"; done | sort -u)
    echo "# node 1: server QPs owned by pid(s) $(paste -sd' ' <<<"$owners") (accepting process $main)"
    [ -n "$owners" ] || bad "no server QP mid-transfer"
    for p in $owners; do
        [ "$p" != "$main" ] || bad "the accepting process $main still owns a QP mid-transfer"
    done
    [ $rc -eq 0 ] || grep -E 'WARN|ERROR|take|mov' "$dir.log" | tail -n 20 | sed 's/^/    | srv: /'
    [ $rc -eq 0 ] && echo "PASS fork_takeover (node 1: every connection served from the child's own QP)"
    exit $rc
fi

pair_wait fork-takeover-srv-up 240 || { echo "FAIL fork_takeover: no server"; exit 1; }
head -c $((4 << 20)) /dev/urandom > "$T_WORK/data.bin"
dir=$T_WORK/cli
pair_shim "$dir" timeout 240 "$EX/fork_client" "$RDMA_VM_PEER:$PORT" --conns $K --parallel $K \
    --file "$T_WORK/data.bin" --pause-ms 4000 --timeout 120 > "$T_WORK/cli.out" 2> "$T_WORK/cli.err" &
cli=$!
wait "$cli"
rc=$?
pair_signal fork-takeover-done
fails=0
bad() { echo "FAIL fork_takeover: $*"; fails=$((fails + 1)); }
line=$(grep -E '^(ok|FAILED) ' "$T_WORK/cli.out" | tail -n1)
echo "# client: ${line:-no closing line}"
[ $rc -eq 0 ] && [[ $line == "ok $K/$K connections"* ]] ||
    bad "client exited $rc: ${line:-no result} $(grep -m2 ' FAIL ' "$T_WORK/cli.out" | paste -sd'|') $(tail -c 200 "$T_WORK/cli.err")"
out=$(env -u LD_PRELOAD "$T_BIN" stat --dir "$dir" --all --json 2>&1)
rdma=$(python3 -c 'import json,sys; print(sum(json.loads(l)["conns"]["rdma"] for l in sys.argv[1].splitlines() if l.strip()))' "$out" 2>/dev/null)
[ "${rdma:-0}" -eq $K ] || bad "client's connections on RDMA: ${rdma:-?}, want $K"
resumed=$(grep -c "resumed with the peer's new process" "$dir.log")
echo "# client: $resumed resume(s): $(grep -o "new process in [0-9]* us" "$dir.log" | awk '{ print $4 }' | paste -sd' ') us"
[ "$resumed" -eq $K ] || bad "$resumed resumes towards the server's children, want $K"
[ $fails -eq 0 ] && echo "PASS fork_takeover (node 0: $K connections intact across the move)" && exit 0
grep -E 'WARN|ERROR|resum|mov' "$dir.log" | tail -n 20 | sed 's/^/    | cli: /'
exit 1
