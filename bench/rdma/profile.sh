#!/usr/bin/env bash
# Instruction profile of a round trip: rsock (blocking and epoll-driven), kernel TCP and
# raw verbs (ib_send_lat -e), each client under callgrind in one test-bed guest
# (bench/rdma/profile-guest.sh). The guest has no PMU, so perf cannot sample there;
# callgrind counts exactly, in user space only.
#
#   bench/rdma/profile.sh [--no-build] [--out DIR] [--base REV]
#
# --base REV also counts the syscalls of the epoll-driven client with the shim of git
# revision REV (built from a clean copy in .cache/rdma-bench-build/), beside this tree's.
# Writes bench/rdma/results/profile-latest.md (from the default DIR,
# bench/rdma/results/profile-raw, which keeps callgrind's files). Exit status: 0 = every
# cell profiled and rsock's connections were RDMA; 1 = otherwise; 97/98 = test-bed failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
BUILD=1 OUT=$ROOT/bench/rdma/results/profile-raw BASE=
while (($#)); do
  case $1 in
    --no-build) BUILD=0 ;;
    --out) OUT=${2:?}; shift ;;
    --base) BASE=${2:?}; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--no-build] [--out DIR] [--base REV]" >&2; exit 2 ;;
  esac
  shift
done
. bench/rdma/host-lib.sh
log() { printf 'profile: %s\n' "$*" >&2; }
OUT=$(bench_out "$OUT") || exit 2
bench_bins "$OUT" "$BUILD" || exit $?
vm_env=(-e BENCH_BIN="$OUT/bin")
if [[ -n $BASE ]]; then
  sha=$(git rev-parse --verify "$BASE^{commit}") || { log "unknown revision $BASE"; exit 2; }
  src=$ROOT/.cache/rdma-bench-build/src-${sha:0:12}
  if [[ ! -f $src/target/release/librsock.so ]]; then
    log "building $BASE (${sha:0:12}) in ${src#"$ROOT"/}"
    mkdir -p "$src" && git archive "$sha" | tar -x -C "$src" || exit 1
    (cd "$src" && CARGO_TARGET_DIR=$src/target cargo build --release -p rsock-preload >&2) || { log "build failed"; exit 1; }
  fi
  mkdir -p "$OUT/bin/base" && cp "$src/target/release/librsock.so" "$OUT/bin/base/" || exit 1
  vm_env+=(-e BASE_BIN="$OUT/bin/base")
fi
tests/rdma-vm/setup.sh >&2 || { log "test bed setup failed"; exit 97; }
need=()
for c in valgrind strace; do command -v $c >/dev/null || need+=($c); done
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
    { log "cannot install ${need[*]}"; exit 1; }
fi
rm -f "$OUT"/*.cg "$OUT"/strace-*.txt
rc=0
tests/rdma-vm/run.sh --timeout 2400 "${vm_env[@]}" -- bench/rdma/profile-guest.sh --out "$OUT" || rc=$?
((rc == 97 || rc == 98)) && exit $rc
[[ -s $OUT/runs.txt ]] || { log "no data (status $rc)"; exit 1; }
{
  python3 bench/rdma/profile_report.py "$OUT" || { log "report failed"; exit 1; }
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src preload 2>/dev/null || echo ' + uncommitted changes')."
} >"$OUT/report.md"
[[ $OUT == "$ROOT/bench/rdma/results/profile-raw" ]] && cp "$OUT/report.md" bench/rdma/results/profile-latest.md
cat "$OUT/report.md"
grep -q '^FAILED' "$OUT/report.md" && exit 1
exit $rc
