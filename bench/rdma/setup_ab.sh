#!/bin/bash
# Connection setup cost, A/B: connect + 1-byte echo + close, N (default 150) times in a row,
# under a base build of the shim, this build, and kernel TCP, three rounds interleaved.
# Inside the test bed:  tests/rdma-vm/run.sh -- bench/rdma/setup_ab.sh BASE_SO
# (BASE_SO e.g. from `git worktree add ../base REV && cargo build --release` there).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
EX=$PWD/target/release/examples
NEW=$PWD/target/release/librsock.so BASE=${1:?usage: setup_ab.sh BASE_SO}
export RSOCK_CONNECT_TIMEOUT_MS=5000 RSOCK_STATS_KEEP=1
N=${N:-150}
CLI='import socket, sys, time
n = int(sys.argv[1]); t0 = time.time()
for i in range(n):
    s = socket.create_connection(("10.77.0.1", int(sys.argv[2])))
    s.sendall(b"x"); assert s.recv(1) == b"x"; s.close()
print("%.1f" % ((time.time() - t0) / n * 1e6))'
port=7500
run() { # LABEL SO
    port=$((port + 1))
    if [ -n "$2" ]; then
        RSOCK_STATS_DIR=/tmp/st-$1-$port LD_PRELOAD=$2 timeout 300 $EX/echo_server 10.77.0.1:$port > /dev/null 2>&1 &
    else
        timeout 300 $EX/echo_server 10.77.0.1:$port > /dev/null 2>&1 &
    fi
    local pid=$!; sleep 3
    local us
    if [ -n "$2" ]; then us=$(RSOCK_STATS_DIR=/tmp/stc-$1-$port LD_PRELOAD=$2 python3 -c "$CLI" $N $port); else us=$(python3 -c "$CLI" $N $port); fi
    kill $pid; wait $pid 2>/dev/null
    local rd=$(target/release/rsock stat --dir /tmp/stc-$1-$port --all --json 2>/dev/null | python3 -c 'import json,sys; print(sum(json.loads(l)["conns"]["rdma"] for l in sys.stdin if l.strip()))')
    echo "setup $1 us_per_conn=$us rdma_conns=$rd"
}
for r in 1 2 3; do run base "$BASE"; run new "$NEW"; run tcp ""; done
