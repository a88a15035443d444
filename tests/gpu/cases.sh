# Sourced by tests/gpu/run.sh and tests/gpu/bundle.sh: the GPU check's end-to-end cases and how
# one is built. Needs ROOT (the repository) and BUILD (a build with MESHC_CUDA=ON, or a bundle
# of its outputs); E2E_DIR (default $BUILD/gpu-e2e) holds one folder per case.

# gpu_cases <number of GPUs>: one case per line, example|mesh|math: every example on [data=1] and
# on all the GPUs, the transformer also in TF32 and bf16.
gpu_cases() {
  local meshes=("data=1")
  [ "$1" -gt 1 ] && meshes+=("data=$1")
  local example mesh
  for example in mlp transformer bert performer moe vit; do
    for mesh in "${meshes[@]}"; do echo "$example|$mesh|fp32"; done
  done
  echo "transformer|data=1|tf32"
  echo "transformer|data=1|bf16"
}

# case_checks <case>: what a case's check does beyond the forward run: the fp32 cases' train
# blocks also train 5 steps and resume from a checkpoint (compile_example.py --train-steps).
case_checks() {
  [[ $1 == *"|fp32" ]] && echo "--train-steps 5"
  return 0
}

# compile_case <example|mesh|math> [compile_example.py's options]: builds the case's CUDA runner
# (skipped with --reuse when it exists) and, with --check or --prepare, what those do.
compile_case() {
  local example mesh math
  IFS='|' read -r example mesh math <<<"$1"
  shift
  local cblas_include mpi_libs=() library
  cblas_include=$(dirname "$(find /usr/include -name cblas.h -path '*openblas*' 2>/dev/null | head -1)")
  # meshrt_nccl's MPI libraries (its launch through mpirun), one --lib each.
  if [ -f "$BUILD/runtime/nccl/meshrt_nccl_mpi_libs.txt" ]; then
    while read -r library; do
      [ -n "$library" ] && mpi_libs+=("--lib=$library")
    done <"$BUILD/runtime/nccl/meshrt_nccl_mpi_libs.txt"
  fi
  python3 "$ROOT/tests/cuda/compile_example.py" --meshc "$BUILD/compiler/tools/meshc" \
    --example "$ROOT/dsl-examples/$example.mesh" \
    --workdir "${E2E_DIR:-$BUILD/gpu-e2e}/$example-$mesh-$math" \
    --nvcc "${CUDACXX:-/usr/local/cuda/bin/nvcc}" --mesh "$mesh" --layout auto --math "$math" \
    --include "$ROOT/runtime/include" --include "$ROOT/runtime/kernels/include" \
    --include "$ROOT/runtime/cuda/include" --include "$ROOT/runtime/nccl/include" \
    --include "$ROOT/compiler/codegen/support" --include "$cblas_include" \
    --lib="$BUILD/runtime/cuda/libmeshrt_cuda.a" --lib="$BUILD/runtime/nccl/libmeshrt_nccl.a" \
    --lib="$BUILD/runtime/kernels/libmeshrt_kernels.a" --lib="$BUILD/runtime/libmeshrt.a" \
    --lib=-lopenblas "${mpi_libs[@]}" "$@"
}
