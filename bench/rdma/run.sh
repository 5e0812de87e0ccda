#!/usr/bin/env bash
# RDMA benchmark: rsock against raw verbs, rdma-core's rsocket and kernel TCP, all in ONE
# boot of the Soft-RoCE test bed (tests/rdma-vm), on the same rxe device. See
# docs/BENCHMARKS.md.
#
#   bench/rdma/run.sh            full run (5 runs of everything; about 10-15 min + boot),
#                                writes bench/rdma/results/latest.md and latency.png
#   bench/rdma/run.sh --smoke    one short iteration of each measurement (a few minutes
#                                with the boot); fails if one cannot run or rsock's did not
#                                go over RDMA; writes nothing under results/
#
# Options: --runs N (default 5), --out DIR (raw data; default bench/rdma/results/raw for a
# full run, .cache/rdma-bench-smoke for --smoke), --no-build (skip cargo build),
# --rev REV (build and measure git revision REV from a private copy in
# .cache/rdma-bench-build/, so that other work in the tree cannot change what is measured),
# --vm-opt OPT (passed to tests/rdma-vm/run.sh, repeatable, e.g. --vm-opt --smp=2).
# The binaries are copied to DIR/bin before the boot and the guest uses that copy: a
# rebuild in the shared tree during the run cannot swap them.
# Installs what it needs (gnuplot-nox; the bed's packages through tests/rdma-vm/setup.sh).
# Exit status: 0 = every measurement ran and rsock's went over RDMA; 1 = some failed;
# 97/98 = test-bed failure/timeout (from tests/rdma-vm/run.sh); 2 = usage.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD

SMOKE=0 RUNS= OUT= BUILD=1 VMOPTS=() REV=
while (($#)); do
  case $1 in
    --smoke) SMOKE=1 ;;
    --runs) RUNS=${2:?}; shift ;;
    --out) OUT=${2:?}; shift ;;
    --no-build) BUILD=0 ;;
    --rev) REV=${2:?}; shift ;;
    --vm-opt) VMOPTS+=("${2:?}"); shift ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--smoke] [--runs N] [--out DIR] [--no-build] [--rev REV] [--vm-opt OPT]..." >&2; exit 2 ;;
  esac
  shift
done
if [[ -z $OUT ]]; then
  if ((SMOKE)); then OUT=$ROOT/.cache/rdma-bench-smoke; else OUT=$ROOT/bench/rdma/results/raw; fi
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
case $OUT in "$ROOT"/*) ;; *) echo "--out must be inside $ROOT (the guest sees only the project)" >&2; exit 2 ;; esac

log() { printf 'rdma-bench: %s\n' "$*" >&2; }

# --- what the host needs ---------------------------------------------------------------
TGT=$ROOT/target/release
if [[ -n $REV ]]; then
  sha=$(git rev-parse --verify "$REV^{commit}") || { log "unknown revision $REV"; exit 2; }
  src=$ROOT/.cache/rdma-bench-build/src-${sha:0:12}
  if [[ ! -f $src/target/release/librsock.so ]] || ((BUILD)); then
    log "building $REV (${sha:0:12}) in ${src#"$ROOT"/}"
    mkdir -p "$src"
    git archive "$sha" | tar -x -C "$src" || exit 1
    (cd "$src" && CARGO_TARGET_DIR=$src/target cargo build --release --workspace --lib --bins --examples >&2) || { log "build failed"; exit 1; }
  fi
  TGT=$src/target/release
elif ((BUILD)); then
  log "cargo build --release --workspace --lib --bins --examples"
  cargo build --release --workspace --lib --bins --examples >&2 || { log "build failed"; exit 1; }
fi
rm -rf "$OUT/bin"
mkdir -p "$OUT/bin"
for f in librsock.so rsock examples/pingpong examples/rdma_pingpong; do
  [[ -e $TGT/$f ]] || { log "missing $TGT/$f (cargo build --release --workspace --examples)"; exit 2; }
  cp "$TGT/$f" "$OUT/bin/" || exit 1
done
tests/rdma-vm/setup.sh >&2 || { log "test bed setup failed"; exit 97; }
# A full run also needs strace (the profile) and gnuplot-nox (the plot).
need=()
((SMOKE)) || command -v strace >/dev/null || need+=(strace)
((SMOKE)) || command -v gnuplot >/dev/null || need+=(gnuplot-nox)
if ((${#need[@]})); then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
    { apt-get update >&2 && apt-get install -y --no-install-recommends "${need[@]}" >&2; } ||
    log "could not install ${need[*]}"
fi
command -v python3 >/dev/null || { log "python3 is needed for the report"; exit 2; }

# --- machine description ---------------------------------------------------------------
{
  echo "date_utc=$(date -u '+%Y-%m-%d %H:%M UTC')"
  if [[ -n $REV ]]; then
    echo "commit=$(git rev-parse --short "$REV") (built from a clean copy)"
  else
    echo "commit=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- src preload 2>/dev/null || echo ' + uncommitted changes in src/ or preload/')"
  fi
  echo "host_cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "host_cpus=$(nproc)"
  echo "host_kernel=$(uname -r)"
  echo "host_load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "qemu=$(qemu-system-x86_64 --version | head -1)"
  echo "rdma_core=$(dpkg-query -W -f='${Version}' rdma-core 2>/dev/null)"
  echo "perftest=$(dpkg-query -W -f='${Version}' perftest 2>/dev/null)"
  echo "iperf3=$(dpkg-query -W -f='${Version}' iperf3 2>/dev/null)"
  echo "vm_opts=${VMOPTS[*]:-(defaults: --smp 2 --mem 2048 --mtu 1500)}"
} >"$OUT/host.txt"

# --- one boot --------------------------------------------------------------------------
args=(--out "$OUT")
((SMOKE)) && args+=(--smoke)
[[ -n $RUNS ]] && args+=(--runs "$RUNS")
start=$SECONDS
log "booting the test bed: bench/rdma/guest.sh ${args[*]}"
rc=0
tests/rdma-vm/run.sh --timeout 2400 -e BENCH_BIN="$OUT/bin" "${VMOPTS[@]}" -- bench/rdma/guest.sh "${args[@]}" || rc=$?
echo "host_load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/host.txt"
echo "wall_s=$((SECONDS - start))" >>"$OUT/host.txt"
log "guest finished with status $rc after $((SECONDS - start)) s"
if ((rc == 97 || rc == 98)) || [[ ! -s $OUT/data.txt ]]; then
  log "no data (test bed status $rc)"
  exit "$((rc ? rc : 1))"
fi

# --- report ----------------------------------------------------------------------------
python3 bench/rdma/report.py "$OUT" || { log "report failed"; exit 1; }
if command -v gnuplot >/dev/null && [[ -s $OUT/latency.dat ]]; then
  gnuplot -e "datafile='$OUT/latency.dat'; outfile='$OUT/latency.png'" bench/rdma/latency.gp ||
    log "gnuplot failed"
fi
if ((SMOKE)); then
  cat "$OUT/report.md"
else
  cp "$OUT/report.md" bench/rdma/results/latest.md
  [[ -f $OUT/latency.png ]] && cp "$OUT/latency.png" bench/rdma/results/latency.png
  log "wrote bench/rdma/results/latest.md and latency.png (raw data: ${OUT#"$ROOT"/})"
  sed -n '/^## Summary/,/^## Latency/p' bench/rdma/results/latest.md
fi
exit "$rc"
