#!/usr/bin/env bash
# Host-side check that the RDMA layer adds no load-time dependency on rdma-core:
# librsock.so (and the example that links the whole layer) must have no DT_NEEDED entry
# for libibverbs/librdmacm and no undefined ibv_*/rdma_* symbol; the layer reaches them
# only through dlopen/dlsym (src/rdma/ffi.rs).
#
#   cargo build --release --examples && tests/rdma/needed.sh [FILE...]
#
# rdma-sys's build script still emits -libverbs -lrdmacm (pkg-config); they are dropped
# because rustc links with -Wl,--as-needed and nothing references their symbols. Calling
# an rdma-sys extern function directly (instead of through ffi::lib()) would break that,
# and this check would catch it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
files=("$@")
((${#files[@]})) || files=(target/release/librsock.so target/release/examples/rdma_pingpong)
pass=0 fail=0
for f in "${files[@]}"; do
  if [[ ! -f $f ]]; then
    echo "FAIL $f: missing (cargo build --release --examples)"; fail=$((fail + 1)); continue
  fi
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  if grep -Eq 'libibverbs|librdmacm' <<<"$needed"; then
    echo "FAIL $f: NEEDED $needed"; fail=$((fail + 1))
  else
    echo "PASS $f: NEEDED ${needed% }"; pass=$((pass + 1))
  fi
  undef=$(nm -D --undefined-only "$f" 2>/dev/null | awk '{print $NF}' | grep -E '^(ibv_|rdma_|__ibv_)' | tr '\n' ' ')
  if [[ -n $undef ]]; then
    echo "FAIL $f: undefined rdma-core symbols: $undef"; fail=$((fail + 1))
  else
    echo "PASS $f: no undefined ibv_*/rdma_* symbol"; pass=$((pass + 1))
  fi
done
echo "$pass passed, $fail failed"
((fail == 0))
