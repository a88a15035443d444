#!/usr/bin/env bash
# The prepared device check for a GPU machine (one command, under 8 minutes with 16 cores):
#   tests/gpu/run.sh [results-file]                    (default: build-gpu/gpu-results.txt)
#   tests/gpu/run.sh --bundle DIR [results-file]       (default: DIR/gpu-results.txt)
# The first form builds everything there; the second runs what tests/gpu/bundle.sh prepared on a
# machine without a GPU (for a GPU machine that cannot build meshc: no LLVM, no registry), and
# skips the steps that need meshc itself there (the installed package's consumer, meshc run).
# 1. installs what is missing (scripts/install-deps) and builds meshc, meshrt_cuda, meshrt_nccl
#    and the GPU programs with CUDA (build-gpu/, sm_90);
# 2. runs the NCCL backend's collectives test (and point-to-point send / recv), the lane-math unit
#    test and every device support function against its CPU version (tests/gpu/support_check.cu);
#    the installed package's CUDA consumer (meshc_add_program ... BACKEND cuda, ctest
#    consumer.cuda.build_and_run) run on the GPUs against the interpreter;
# 3. end-to-end equivalence on the GPU (tests/gpu/cases.sh): every example compiled with
#    --emit=cuda for the mesh [data=1] and for [data=<all GPUs>] (layout auto), run on one GPU
#    per rank and compared with the reference interpreter (tests/e2e/compare_outputs.py's rule);
#    the transformer also with --cuda-math=tf32 and bf16 (compared at f16's and bf16's rounding);
#    the fp32 cases' train blocks also take 5 training steps on the GPU against the
#    interpreter's 5, and resume from a checkpoint saved on the GPU against 10 uninterrupted
#    steps; then the transformer's train step traced (and profiled by meshc run --profile);
#    the mlp runner for [data=2] as 2 processes (mpirun -np 2, NCCL over MPI) vs the interpreter,
#    and meshc run --backend nccl --processes;
#    then meshc calibrate --backend nccl (or its probe alone on one GPU);
# 4. generated einsum (meshrt::cuda::einsum2) against raw cuBLAS on transformer shapes;
# 5. NCCL all-reduce bus bandwidth on every GPU (compare with the nccl-tests figures in the
#    brief: 8xH200 ~240 GB/s at 16 MiB, ~368 at 64 MiB).
# Every step's output goes to stdout and to the results file; the exit status is the number of
# failed steps (0: all passed).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=""
if [ "${1:-}" = "--bundle" ]; then
  BUNDLE=$(cd "$2" && pwd) || exit 1
  shift 2
fi
BUILD=${BUNDLE:-${MESHC_GPU_BUILD:-$ROOT/build-gpu}}
RESULTS=${1:-$BUILD/gpu-results.txt}
JOBS=$(nproc)
mkdir -p "$BUILD"
: >"$RESULTS"
failures=0
started=$(date +%s)
log() { echo "$*" | tee -a "$RESULTS"; }
step() { # step <name> <command...>: runs, logs, counts a failure
  local name=$1
  shift
  log "=== $name ($(($(date +%s) - started)) s)"
  "$@" 2>&1 | tee -a "$RESULTS"
  local status=${PIPESTATUS[0]}
  if [ "$status" -ne 0 ]; then
    log "FAILED: $name (exit $status)"
    failures=$((failures + 1))
  fi
  return "$status"
}
skip() { log "=== $1: skipped ($2)"; }
export ROOT BUILD
source "$ROOT/tests/gpu/cases.sh"
export -f compile_case

log "meshc GPU check, $(date -u), $(nvidia-smi -L 2>/dev/null | wc -l) GPU(s)${BUNDLE:+, bundle $BUNDLE}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$RESULTS"

# 1. Dependencies and build, or the bundle's libraries and the machine's cuBLAS and NCCL.
if [ -n "$BUNDLE" ]; then
  cuda_dirs=$(find /usr/local/cuda*/ /usr/lib /opt \( -name 'libcublasLt.so.1[0-9]' -o -name \
    'libnccl.so.2' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
  export LD_LIBRARY_PATH="$BUNDLE/lib:$cuda_dirs${LD_LIBRARY_PATH:-}"
  log "libraries: $LD_LIBRARY_PATH"
else
  # (idempotent: installs only the missing Debian packages)
  step "install-deps" "$ROOT/scripts/install-deps" || exit 1
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  step "configure" cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMESHC_CUDA=ON \
    -DMESHC_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 "${launcher[@]}" || exit 1
  step "build" ninja -C "$BUILD" -j"$JOBS" meshc meshrt_cuda meshrt_nccl test_cuda_rowmath \
    test_nccl_comm gpu_einsum_bench gpu_nccl_bandwidth gpu_support_check || exit 1
fi

# 2. Unit tests (the NCCL one runs real collectives when GPUs are present).
step "unit: NCCL backend collectives" timeout 120 "$BUILD/tests/cuda/test_nccl_comm"
step "unit: lane math" timeout 60 "$BUILD/tests/cuda/test_cuda_rowmath"
step "device support functions vs the CPU's" timeout 120 "$BUILD/tests/cuda/gpu_support_check"
if [ -n "$BUNDLE" ]; then
  skip "consumer: meshc_add_program BACKEND cuda on the GPUs" "needs meshc installed here"
else
  # The install needs every installed target built (meshrt_mpi only where MPI was found).
  mpi_target=$(ninja -C "$BUILD" -t targets all 2>/dev/null | grep -o '^meshrt_mpi:' | tr -d :)
  step "consumer: meshc_add_program BACKEND cuda on the GPUs" bash -c \
    "ninja -C '$BUILD' -j$JOBS meshrt_launch $mpi_target && ctest --test-dir '$BUILD' --output-on-failure -R 'consumer[.](install|cuda[.]build_and_run)'"
fi

# 3. End-to-end equivalence: compile every case in parallel, then run them one after another.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 1 ] || gpus=1
cases=()
while read -r c; do cases+=("$c"); done < <(gpu_cases "$gpus")
if [ -z "$BUNDLE" ]; then
  step "e2e: compile ${#cases[@]} cases with nvcc" \
    bash -c 'printf "%s\n" "$@" | xargs -P '"$JOBS"' -I{} bash -c "compile_case \"{}\"" ' _ "${cases[@]}"
fi
passed=0
for c in "${cases[@]}"; do
  if step "e2e: $c (generated CUDA vs interpreter)" timeout 180 \
    bash -c "compile_case '$c' --reuse --check $(case_checks "$c")"; then
    passed=$((passed + 1))
  fi
done
log "e2e: $passed of ${#cases[@]} cases match the interpreter"

# Multi-process launch: the same CUDA runner as 2 processes under mpirun (one GPU each, NCCL
# bootstrapped over MPI) against the interpreter, then through meshc run --processes.
if [ "$gpus" -ge 2 ]; then
  mp_dir="$BUILD/gpu-e2e/mlp-data=2-fp32"
  mp_run="mpirun --allow-run-as-root --oversubscribe -np 2"
  step "multi-process: mlp [data=2] runner as 2 processes (mpirun -np 2) vs interpreter" \
    timeout 300 bash -c "compile_case 'mlp|data=2|fp32' --reuse --prepare && \
      $mp_run '$mp_dir/mlp_cuda' '$mp_dir/mlp.mpi.actual' 0 --launch mpi && \
      python3 '$ROOT/tests/e2e/compare_outputs.py' '$mp_dir/mlp.mpi.actual' \
        '$mp_dir/mlp.expected' --path-dtypes '$mp_dir/mlp.path-dtypes'"
  if [ -n "$BUNDLE" ]; then
    skip "multi-process: meshc run --backend nccl --processes" "needs meshc"
  else
    step "multi-process: meshc run --backend nccl --processes (transformer train, 3 steps)" \
      timeout 300 "$BUILD/compiler/tools/meshc" run "$ROOT/dsl-examples/transformer.mesh" \
      --backend nccl --processes --mesh data=2 --layout auto --function lm_train --steps 3 \
      --check --no-plan --cache-dir "$BUILD/gpu-processes"
  fi
else
  skip "multi-process" "one GPU; mpirun -np 2 needs two"
fi

# Traces on the GPUs: the transformer's train step traced (host timestamps around device-synchronized
# op groups and NCCL collectives, meshrt/Trace.h) and profiled against the plan.
if [ -n "$BUNDLE" ]; then
  trace_dir="$BUILD/gpu-e2e/transformer-data=1-fp32"
  step "trace: the transformer's runner, 3 train steps, MESHRT_TRACE" timeout 300 bash -c \
    "MESHRT_TRACE='$BUILD/transformer.trace.json' '$trace_dir/transformer_cuda' \
      '$trace_dir/traced.out' 0 --steps 3 >/dev/null && python3 -c 'import json, sys, collections; \
      events = json.load(open(sys.argv[1]))[\"traceEvents\"]; \
      kinds = collections.Counter(e.get(\"cat\", e[\"ph\"]) for e in events); print(kinds); \
      assert all(e[\"ph\"] in \"XM\" for e in events) and len(events) > 100, kinds' \
      '$BUILD/transformer.trace.json'"
else
  step "trace: meshc run --profile on the nccl backend" timeout 300 \
    "$BUILD/compiler/tools/meshc" run "$ROOT/dsl-examples/transformer.mesh" --backend nccl \
    --mesh "data=$gpus" --layout auto --function lm_train --steps 3 --profile --no-plan \
    --cache-dir "$BUILD/gpu-profile"
fi

# Calibration on the GPUs (meshc calibrate --backend nccl, meshrt/cuda/Calibrate.h): with two GPUs
# or more the whole description; with one, the probe alone at one rank (GEMMs and bandwidth; the
# collectives need two), built by a calibrate run that then stops for want of a second GPU (the
# bundle's was built that way where it was made).
if [ "$gpus" -ge 2 ] && [ -z "$BUNDLE" ]; then
  step "calibrate: meshc calibrate --backend nccl --ranks $gpus" timeout 300 \
    "$BUILD/compiler/tools/meshc" calibrate --backend nccl --ranks "$gpus" --quick \
    -o "$BUILD/gpu-calibrated.json"
else
  build_probe=""
  [ -z "$BUNDLE" ] && build_probe="MESHC_CACHE_DIR='$BUILD/gpu-calibrate' \
    '$BUILD/compiler/tools/meshc' calibrate --backend nccl --quick -o /dev/null;"
  step "calibrate: the GPU probe on one GPU (GEMM fp32 > 1 TFLOP/s, bf16, bandwidth > 100 GB/s)" \
    timeout 300 bash -c "$build_probe \
      '$BUILD/gpu-calibrate/calibrate/probe.bin' --ranks 1 --quick | tee -a '$RESULTS' | \
      python3 -c 'import json, sys; r = json.load(sys.stdin); \
        assert r[\"gemm\"][0][\"flops_per_s\"] > 1e12 and r[\"gemm_bf16\"][0][\"flops_per_s\"] > 1e12 \
          and r[\"stream_bytes_per_s\"] > 1e11, r'"
fi

# 4. and 5. Figures.
step "einsum: generated vs raw cuBLAS" timeout 120 "$BUILD/tests/cuda/gpu_einsum_bench"
step "NCCL all-reduce bus bandwidth" timeout 180 "$BUILD/tests/cuda/gpu_nccl_bandwidth"

log "done in $(($(date +%s) - started)) s, $failures failed step(s); results in $RESULTS"
exit "$failures"
