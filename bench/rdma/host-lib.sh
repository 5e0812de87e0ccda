# Host-side helpers of the bed benchmarks that copy their binaries for the guests
# (pair.sh, profile.sh). Sourced from the project root, after the script defines `log`.

# bench_out DIR: makes DIR and prints its absolute path; it must be inside the project,
# which is all the guests see.
bench_out() {
  local dir
  mkdir -p "$1" && dir=$(cd "$1" && pwd) || return 2
  case $dir in "$PWD"/*) ;; *) echo "--out must be inside $PWD (the guests see only the project)" >&2; return 2 ;; esac
  printf '%s\n' "$dir"
}

# bench_bins OUT BUILD: builds the release tree if BUILD is 1, then copies the shim, rsock
# and pingpong into OUT/bin: a rebuild in the tree during the run cannot swap what the
# guests run.
bench_bins() {
  local f
  if (($2)); then
    cargo build --release --workspace --lib --bins --examples >&2 || { log "build failed"; return 1; }
  fi
  rm -rf "$1/bin" && mkdir -p "$1/bin"
  for f in librsock.so rsock examples/pingpong; do
    cp "target/release/$f" "$1/bin/" || { log "missing target/release/$f"; return 2; }
  done
}
