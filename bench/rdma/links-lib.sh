# Shared by bench/rdma/links.sh (one guest) and links-pair.sh (two guests): the modes, the
# report of one run, and the plan of runs (MODES: the modes compared, default
# "tcp nolinks links"; links-nogrant is links with RSOCK_LINK_GRANTS=0; links-b is links
# with another build of the shim, SO_B, for an A/B in one boot). The caller defines `one MODE PAR [keep]
# EXTRA...` (run the server and client of one measurement) and sets B (target/release).

# links_env MODE STATS_DIR CONNECT_TIMEOUT_MS: the env command that runs a program in MODE.
links_env() {
  case $1 in
    tcp) echo env ;;
    links) echo env LD_PRELOAD=$B/librsock.so RSOCK_LINKS=1 ${XENV:-} RSOCK_STATS_DIR=$2 RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$3 ;;
    links-nogrant) echo env LD_PRELOAD=$B/librsock.so RSOCK_LINKS=1 RSOCK_LINK_GRANTS=0 RSOCK_STATS_DIR=$2 RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$3 ;;
    links-b) echo env LD_PRELOAD=${SO_B:?links-b needs SO_B, another build of librsock.so} RSOCK_LINKS=1 RSOCK_STATS_DIR=$2 RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$3 ;;
    nolinks) echo env LD_PRELOAD=$B/librsock.so RSOCK_STATS_DIR=$2 RSOCK_STATS_KEEP=1 RSOCK_CONNECT_TIMEOUT_MS=$3 ;;
  esac
}

# links_report MODE PAR RC STATS_DIR EXTRA...: one line from the client's JSON in
# /tmp/cli.out, then each rsock process's counters.
links_report() {
  local mode=$1 par=$2 rc=$3 d=$4; shift 4
  python3 - "$mode" "$par" "$rc" "$*" <<'PY'
import json, sys
mode, par, rc, extra = sys.argv[1:]
lines = [l for l in open('/tmp/cli.out') if l.startswith('{')]
if not lines:
    print(f"{mode:13} par={par:>2} {extra:18} rc={rc} no result"); sys.exit()
j = json.loads(lines[-1])
print(f"{mode:13} par={par:>2} {extra:18} rc={rc} ok={j['ok']} setup/s={j['setup_per_s']:8.1f} cpu_ms={j['cpu_ms_per_setup']:5.2f} connect_p50={j['connect_ms_p50']:6.2f} rtt_p50={j['rtt_us_p50']:8.1f} qps={j['rc_qps']} cli_pin_kib={j['cli_vmpin_kib']}")
PY
  [ "$mode" != tcp ] && env -u LD_PRELOAD "$B/rsock" stat --dir "$d" --all --json | python3 -c '
import sys, json
for l in sys.stdin:
    if l.strip():
        p = json.loads(l); print("     ", p["comm"], "conns", p["conns"], "links", p.get("links"))'
  return 0
}

# links_plan: churn, one after another and from 16 threads, the modes in turn, twice;
# then the round trip on one of 20 open connections.
links_plan() {
  local rep par mode modes=${MODES:-tcp nolinks links}
  for rep in 1 2; do
    for par in 1 16; do
      for mode in $modes; do one $mode $par --close-each 1; done
    done
  done
  for mode in $modes; do one $mode 1 keep --rtt 2000; done
}
