#!/usr/bin/env bash
# Checks that the matrix's assertions can fail: applies one mutation at a time to a copy of
# run.sh (a wrong expected count, a wrong byte total, a corrupted file, a missing setting...),
# runs the affected cell on a small file, and expects it to FAIL. Prints one line per
# mutation and `N caught, N missed`; exits non-zero if any mutation went unnoticed.
#
# usage: tests/passthrough/selftest.sh   (same RSOCK_SO / RSOCK_BIN / build as run.sh)

set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export RSOCK_SO=$(readlink -f "${RSOCK_SO:-$root/target/release/librsock.so}")
export RSOCK_BIN=$(readlink -f "${RSOCK_BIN:-$root/target/release/rsock}")
export RSOCK_EXAMPLES=${RSOCK_EXAMPLES:-$root/target/release/examples}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rsock-selftest.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tests"
cp -r "$here/../lib" "$tmp/tests/lib"
mkdir -p "$tmp/tests/passthrough"

caught=0 missed=0
# mutate CELL DESCRIPTION PYTHON_OLD PYTHON_NEW: replaces the first occurrence of OLD
# (which must exist) inside function cell_CELL's region of run.sh and runs that cell.
mutate() {
    local cell=$1 desc=$2 old=$3 new=$4 out
    python3 - "$here/run.sh" "$tmp/tests/passthrough/run.sh" "$cell" "$old" "$new" <<'EOF' || { echo "ERROR $desc: pattern not found"; missed=$((missed + 1)); return; }
import sys
src, dst, cell, old, new = sys.argv[1:]
s = open(src).read()
start = s.find("\ncell_" + cell + "()")
if start < 0:
    sys.exit(1)
i = s.find(old, start, s.find("\n}\n", start))  # in the cell's own body
if i < 0:
    # helpers shared by several cells come just before the cell functions
    i = s.rfind(old, 0, start)
if i < 0:
    sys.exit(1)
open(dst, "w").write(s[:i] + new + s[i + len(old):])
EOF
    out=$(T_MB=2 timeout 120 bash "$tmp/tests/passthrough/run.sh" "$cell" 2>&1 | grep -E "^(PASS|FAIL) $cell( |:)" | head -1)
    rm -rf "$tmp"/rsock-test.*  # work dirs kept by the failing runs
    if [[ $out == FAIL* ]]; then
        caught=$((caught + 1)); echo "caught  $desc -> ${out:0:160}"
    else
        missed=$((missed + 1)); echo "MISSED  $desc -> ${out:-no result}"
    fi
}
export TMPDIR=$tmp   # run.sh work dirs go under $tmp

mutate nc_client_to_server "wrong conns count" "'conns.tcp==1' 'conns.rdma==0'" "'conns.tcp==2' 'conns.rdma==0'"
mutate nc_client_to_server "wrong rx bytes" "'rx.tcp==SIZE'" "'rx.tcp==SIZE+1'"
mutate nc_server_to_client "wrong fallback reason count" "'fallback.excluded==1' 'tx.tcp==SIZE'" "'fallback.excluded==0' 'tx.tcp==SIZE'"
mutate nc_bidirectional "wrong file compared" 'expect_same_file "$DATA2" cli.out' 'expect_same_file "$DATA" cli.out'
mutate nc_bidirectional "sockets not empty expected" "'rx.tcp==B' 'sockets==[]'" "'rx.tcp==B' 'sockets!=[]'"
mutate iperf3 "client exit status" '-t 2 -J "$@"' '-t 2 -J --bogus-flag "$@"'
mutate iperf3_parallel4 "wrong stream count" 'local n=$((1 + streams))' 'local n=$((2 + streams))'
mutate iperf3_reverse "sender bytes bound" "'SENT <= tx.tcp <= SENT + 65536'" "'2 * SENT <= tx.tcp'"
mutate iperf2 "server byte bound" "'B <= rx.tcp <= B + 65536'" "'B + 10**12 <= rx.tcp'"
mutate socat_tcp_to_file "socat per-socket bytes" 'socat_stats srv 0 "$SIZE"' 'socat_stats srv 0 "$((SIZE - 1))"'
mutate socat_file_to_tcp "corrupted received file" 'expect_same_file "$DATA" recv.bin' 'printf x >> recv.bin; expect_same_file "$DATA" recv.bin'
mutate socat_ipv6 "wrong local address" '"[::1]:%d" % P and s["peer"]' '"[::1]:%d" % (P+1) and s["peer"]'
mutate socat_fork_server "wrong process count" "'nproc==4'" "'nproc==5'"
mutate curl_http_server "curl exact rx" '-D IN=$((dl + hdr))' '-D IN=$((dl + hdr + 1))'
mutate curl_http_server "listener never up" 'wait_listen "$PORT" 15 srv' 'wait_listen "$PORT2" 2 srv'
mutate stream_copy "stream_copy tx" "'tx.tcp==SIZE' 'rx.tcp==0'" "'tx.tcp==SIZE-1' 'rx.tcp==0'"
mutate no_sockets "socket-using program creates stats" 'shimmed "$CELL_DIR/st" sh -c '"'"'ls / >/dev/null;' 'shimmed "$CELL_DIR/st" sh -c '"'"'python3 -c "import socket as s; l=s.socket(); l.listen(); c=s.socket(); c.connect(l.getsockname())"; ls / >/dev/null;'
mutate fd_edge "output differs" 'diff plain.out shim.out' 'echo extra >> shim.out; diff plain.out shim.out'
mutate fd_edge "wrong conns per pair" '-D N=$((2 * nconn))' '-D N=$((2 * nconn + 1))'
mutate fd_edge "wrong exact tx" "'tx.tcp==SENT'" "'tx.tcp==SENT+1'"
mutate fd_edge "checkpoint fd list" '-D WANT="[$want]"' '-D WANT="[$want,999]"'
mutate refused_connect "blocking refused connect counted" "blocking 'getattr(conns, \"tcp\", 0)==0'" "blocking 'getattr(conns, \"tcp\", 0)==1'"
mutate stats_removed_at_exit "stats kept" 'RSOCK_STATS_DIR="$CELL_DIR/st" $NC -l' 'RSOCK_STATS_DIR="$CELL_DIR/st" RSOCK_STATS_KEEP=1 $NC -l'
mutate enable_0 "shim enabled creates stats" 'bg srv $T env RSOCK_ENABLE=0' 'bg srv $T env RSOCK_ENABLE=1'
mutate malformed_config "one bad variable fewer" 'RSOCK_STATS_SLOTS=-1 RSOCK_FOO=1)' 'RSOCK_FOO=1)'
mutate malformed_config "shim output on stderr" 'expect_empty srv.err "server stderr"' 'echo noise > srv.err; expect_empty srv.err "server stderr"'
mutate two_copies "copies swapped: the inert one is the build" 'LD_PRELOAD="$T_SO:$copy"' 'LD_PRELOAD="$copy:$T_SO"'
mutate two_copies "server counted twice" "'fallback.excluded==1' 'rx.tcp==SIZE'" "'fallback.excluded==1' 'rx.tcp==2*SIZE'"

echo "$caught caught, $missed missed"
[ "$missed" -eq 0 ]
