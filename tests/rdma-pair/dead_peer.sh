#!/usr/bin/env bash
# A peer host that vanishes, on two guests (tests/rdma-vm/run.sh --topology pair): node 1
# serves, node 0 holds three RDMA connections to it, then node 1 takes its link down.
#   keepalive     SO_KEEPALIVE, idle 2 s, interval 1 s, 2 probes: an idle blocked reader
#                 fails with ETIMEDOUT about 4 s later (bound: 12 s);
#   user_timeout  TCP_USER_TIMEOUT 3 s and a writer: its send fails with ETIMEDOUT (bound 12 s);
#   control       neither: its blocked reader is still waiting 14 s later, as on kernel TCP
#                 (so it is keepalive that tells, not some device event).
# On node 1, whose port went down, the device's async event resets the server's streams: its
# blocked reads end with an error within 15 s.
# Every connection echoes a message first and must be on RDMA (the shim's counters).
#
#   tests/rdma-vm/run.sh --topology pair --timeout 600 -- tests/rdma-pair/dead_peer.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
# shellcheck source=../rdma-vm/lib.sh
. tests/rdma-vm/lib.sh
# shellcheck source=../lib/common.sh
. tests/lib/common.sh
rdma_vm_require_guest
[ "${RDMA_VM_TOPOLOGY:-}" = pair ] || { echo "FAIL dead_peer: needs --topology pair"; exit 1; }
t_init
PORT=7300
CTO=20000 # two emulated guests on one host are slow to connect
EX=$T_EXAMPLES
[ -x "$EX/echo_server" ] || { echo "missing $EX/echo_server (cargo build --release --examples)" >&2; exit 2; }

if [ "$RDMA_VM_NODE" = 1 ]; then
    dir=$T_WORK/srv
    env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$dir" RSOCK_CONNECT_TIMEOUT_MS=$CTO RSOCK_LOG="$dir.log" \
        RSOCK_LOG_LEVEL=info timeout 300 "$EX/echo_server" "$RDMA_VM_SELF:$PORT" > "$T_WORK/srv.out" 2>&1 &
    wait_tcp_listen "$PORT" 60 && wait_rdma_listen "$PORT" 60 || { echo "FAIL dead_peer: server did not listen"; exit 1; }
    pair_signal dead-peer-srv-up
    pair_wait cut 240 || { grep -E 'WARN|ERROR|rdma stream' "$dir.log" | tail -n 20 | sed 's/^/    | srv: /'; exit 1; }
    ip link set eth0 down
    echo "# node 1: eth0 down"
    # This side's port went down: the device's async event resets its three streams, and
    # the echo server's blocked reads end with an error (within seconds, not on a timer).
    ended() { [ "$(grep -c 'result=error' "$T_WORK/srv.out")" -ge 3 ]; }
    rc=0
    if wait_until 15 ended; then
        echo "# node 1: server connections ended: $(grep -c 'result=error' "$T_WORK/srv.out") with an error"
    else
        echo "FAIL dead_peer (node 1): the server's connections did not end after the port went down: $(paste -sd'|' "$T_WORK/srv.out")"
        rc=1
    fi
    grep -q 'the port went down' "$dir.log" || { echo "FAIL dead_peer (node 1): no port-down event in the shim's log"; rc=1; }
    pair_wait dead-peer-done 240
    [ $rc -eq 0 ] || grep -E 'WARN|ERROR|INFO  rdma' "$dir.log" | tail -n 10 | sed 's/^/    | srv: /'
    [ $rc -eq 0 ] && echo "PASS dead_peer (node 1: port down resets the server's streams)"
    exit $rc
fi

CLIENT='import errno, os, socket, sys, threading, time
peer, port, cut_flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def conn(opts):
    s = socket.create_connection((peer, port), timeout=60)
    s.settimeout(None)
    for level, name, v in opts:
        s.setsockopt(level, name, v)
    s.sendall(b"hello"); got = b""
    while len(got) < 5:
        got += s.recv(5 - len(got))
    assert got == b"hello", got
    return s
T = socket.IPPROTO_TCP
ka = conn([(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (T, socket.TCP_KEEPIDLE, 2),
           (T, socket.TCP_KEEPINTVL, 1), (T, socket.TCP_KEEPCNT, 2)])
ut = conn([(T, socket.TCP_USER_TIMEOUT, 3000)])
ctl = conn([])
print("# 3 connections echo", flush=True)
res = {}
def reader(name, s):
    try:
        r = s.recv(10)
        res[name] = ("data %r" % r, time.time())
    except OSError as e:
        res[name] = (errno.errorcode.get(e.errno, e.errno), time.time())
def writer(name, s):
    try:
        while True:
            s.sendall(b"x" * 65536)
    except OSError as e:
        res[name] = (errno.errorcode.get(e.errno, e.errno), time.time())
ths = [threading.Thread(target=reader, args=("keepalive", ka), daemon=True),
       threading.Thread(target=writer, args=("user_timeout", ut), daemon=True),
       threading.Thread(target=reader, args=("control", ctl), daemon=True)]
for t in ths: t.start()
time.sleep(0.5)
open(cut_flag, "w").close()
t0 = time.time()
time.sleep(14)
for name in ("keepalive", "user_timeout", "control"):
    r = res.get(name)
    print("%s %s" % (name, "still waiting" if r is None else "%s after %.1f s" % (r[0], r[1] - t0)), flush=True)
os._exit(0)'

pair_wait dead-peer-srv-up 240 || { echo "FAIL dead_peer: no server"; exit 1; }
dir=$T_WORK/cli
env LD_PRELOAD="$T_SO" RSOCK_STATS_DIR="$dir" RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$CTO \
    RSOCK_LOG="$dir.log" RSOCK_LOG_LEVEL=${SHIM_LOG_LEVEL:-debug} timeout 60 python3 -c "$CLIENT" "$RDMA_VM_PEER" "$PORT" \
    /run/rdma-vm/pair/cut > "$T_WORK/cli.out" 2> "$T_WORK/cli.err"
rc=$?
pair_signal dead-peer-done
sed 's/^/# /' "$T_WORK/cli.out"
fails=0
bad() { echo "FAIL dead_peer: $*"; fails=$((fails + 1)); }
[ $rc -eq 0 ] || bad "client exited $rc: $(tail -c 300 "$T_WORK/cli.err" | paste -sd' ')"
secs() { awk -v n="$1" '$1 == n && $3 == "after" { print $4 }' "$T_WORK/cli.out"; }
for n in keepalive user_timeout; do
    line=$(grep "^$n " "$T_WORK/cli.out")
    [[ $line == "$n ETIMEDOUT after "* ]] || bad "$n: want ETIMEDOUT, got: ${line:-nothing}"
    s=$(secs "$n")
    [ -n "$s" ] && awk -v s="$s" 'BEGIN { exit !(s <= 12) }' || bad "$n: detected after ${s:-never} s, bound 12 s"
done
grep -q '^control still waiting$' "$T_WORK/cli.out" || bad "control (no keepalive): $(grep '^control ' "$T_WORK/cli.out")"
out=$(env -u LD_PRELOAD "$T_BIN" stat --dir "$dir" --all --json 2>&1)
rdma=$(python3 -c 'import json,sys; print(sum(json.loads(l)["conns"]["rdma"] for l in sys.argv[1].splitlines() if l.strip()))' "$out" 2>/dev/null)
[ "${rdma:-0}" -eq 3 ] || bad "client's connections on RDMA: ${rdma:-?}, want 3 ($(head -c 300 <<<"$out"))"
grep -q 'peer silent past keepalive' "$dir.log" || bad "the shim's log does not say why: $(grep -m2 'rdma stream' "$dir.log")"
[ $fails -eq 0 ] && echo "PASS dead_peer" && exit 0
grep -vE 'liveness' "$dir.log" | grep -E 'probe|silent|fail|rdma stream|WARN|ERROR' | tail -n 30 | sed 's/^/    | /'
exit 1
