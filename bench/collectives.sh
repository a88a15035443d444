#!/usr/bin/env bash
# One command: builds the collectives benchmark (Release) and prints the table of the threads
# backend's allreduce bus bandwidth against OpenMPI's and memcpy's, measured side by side.
# usage: bench/collectives.sh [build-dir] [bench_collectives options, e.g. --rounds 3]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-bench
if [[ $# -gt 0 && $1 != -* ]]; then
  build=$1
  shift
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMESHC_BUILD_BENCH=ON &&
       ninja -C "$build" -j2 bench_collectives bench_collectives_mpi; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "bench/collectives.sh: the build failed" >&2
  exit 1
fi
"$build/bench/bench_collectives" "$@"
