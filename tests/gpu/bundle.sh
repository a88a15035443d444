#!/usr/bin/env bash
# Prepares tests/gpu/run.sh for a GPU machine that cannot build meshc (no LLVM or Clang, no
# package registry: the lent device machines). Run it here, where a CUDA build exists and no GPU:
#   tests/gpu/bundle.sh [build-dir] [number of GPUs there]   (defaults: build, 1)
# It builds the GPU programs, compiles every end-to-end case of run.sh for that number of GPUs
# (nvcc, sm_90), writes the interpreter's outputs beside each (compile_example.py --prepare),
# builds the calibration probe, strips the binaries and packs them, with the shared libraries a
# bare CUDA image lacks (OpenBLAS, Open MPI and what they need), into gpu-bundle.tar.gz at the
# repository root (ignored by git). cuBLAS and NCCL are the GPU machine's own (its CUDA toolkit
# or its Python packages). There:
#   tar xzf gpu-bundle.tar.gz && tests/gpu/run.sh --bundle gpu-bundle
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
GPUS=${2:-1}
BUNDLE=$ROOT/gpu-bundle
E2E_DIR=$BUNDLE/gpu-e2e
export ROOT BUILD E2E_DIR
source "$ROOT/tests/gpu/cases.sh"
export -f compile_case case_checks

grep -q '^MESHC_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" || {
  echo "error: $BUILD is not configured with -DMESHC_CUDA=ON" >&2
  exit 1
}
programs=(test_cuda_rowmath test_nccl_comm gpu_einsum_bench gpu_nccl_bandwidth gpu_support_check)
ninja -C "$BUILD" meshc meshrt_cuda meshrt_nccl "${programs[@]}"
rm -rf "$BUNDLE" "$ROOT/gpu-bundle.tar.gz"
mkdir -p "$BUNDLE/tests/cuda" "$BUNDLE/lib" "$E2E_DIR"

# The cases, two nvcc at a time (each takes one core for a minute or two).
cases=()
while read -r c; do cases+=("$c"); done < <(gpu_cases "$GPUS")
[ "$GPUS" -ge 2 ] && cases+=("mlp|data=2|fp32") # run.sh's mpirun case
printf '%s\n' "${cases[@]}" | sort -u | xargs -P 2 -I{} bash -c \
  'compile_case "{}" --prepare $(case_checks "{}")'
for program in "${programs[@]}"; do cp "$BUILD/tests/cuda/$program" "$BUNDLE/tests/cuda/"; done

# The calibration probe: meshc calibrate builds it, then stops here for want of a GPU.
MESHC_CACHE_DIR=$BUNDLE/gpu-calibrate "$BUILD/compiler/tools/meshc" calibrate --backend nccl \
  --quick -o /dev/null >/dev/null 2>&1 || true
probe=$BUNDLE/gpu-calibrate/calibrate/probe.bin
[ -x "$probe" ] || {
  echo "error: meshc calibrate built no $probe" >&2
  exit 1
}
find "$BUNDLE/gpu-calibrate" -type f ! -name probe.bin -delete

# Strip every binary; bring the shared libraries that a CUDA image does not have.
binaries=$(find "$BUNDLE" -type f -perm -u+x -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
for binary in $binaries; do strip "$binary"; done
system='^(libc|libm|libdl|librt|libpthread|ld-linux.*|libstdc\+\+|libgcc_s|libz|libcublas|libcublasLt|libnccl|libcudart)\.so'
for binary in $binaries; do ldd "$binary"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  while read -r library; do
    basename "$library" | grep -Eq "$system" || cp -L "$library" "$BUNDLE/lib/"
  done
tar czf "$ROOT/gpu-bundle.tar.gz" -C "$ROOT" gpu-bundle
echo "gpu-bundle.tar.gz: $(du -h "$ROOT/gpu-bundle.tar.gz" | cut -f1), ${#cases[@]} cases," \
  "libraries: $(ls "$BUNDLE/lib" | tr '\n' ' ')"
