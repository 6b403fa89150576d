#!/usr/bin/env bash
# Compile-checks every csrc/cuda/*.cu on a machine WITHOUT a GPU (and with a CPU-only torch):
# nvcc -c for sm_90 against the installed torch's headers, one file at a time, objects to a
# temp dir. Catches syntax, template and type errors in the CUDA code before a GPU run.
#
# Needs: nvcc (CUDA 13 here), a torch wheel (its include/ ships the ATen/cuda and c10/cuda
# headers even in CPU builds), and the cuBLAS / cuSPARSE / cuSOLVER headers that
# ATen/cuda/CUDAContext.h includes: taken from NVIDIA's pip packages (installed if missing,
# ~1 GB). A CPU build of torch lacks the generated c10/cuda/impl/cuda_cmake_macros.h; an
# empty stub stands in for it.
#
# Usage: scripts/cuda_compile_check.sh [file.cu ...]     (default: every csrc/cuda/*.cu)
# Env:   NVCC (default nvcc), CUDA_ARCH (default sm_90), CXX_STD (default c++20: torch >= 2.13
#        headers need C++20; the code itself must also compile as c++17 for torch 2.11),
#        EXTRA_NVCC_FLAGS (e.g. "-Xptxas -v" for the register/spill report).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NVCC="${NVCC:-nvcc}"
ARCH="${CUDA_ARCH:-sm_90}"
STD="${CXX_STD:-c++20}"
PY="${PYTHON:-python3}"

if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "cuda_compile_check: nvcc not found (set NVCC=/path/to/nvcc)" >&2
  exit 2
fi

TORCH_DIR="$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')" || {
  echo "cuda_compile_check: cannot import torch with $PY" >&2
  exit 2
}
PY_INC="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"

# Headers of cuBLAS / cuSPARSE / cuSOLVER: first the CUDA toolkit's own, else NVIDIA's pip wheels.
nvidia_include_dirs() {
  "$PY" - <<'PYEOF'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = set()
for root in roots:
    for header in ("cublas_v2.h", "cusparse.h", "cusolverDn.h"):
        for path in glob.glob(os.path.join(root, "nvidia", "**", header), recursive=True):
            dirs.add(os.path.dirname(path))
print(" ".join(sorted(dirs)))
PYEOF
}
NVCC_BIN_DIR="$(dirname "$(readlink -f "$(command -v "$NVCC")")")"
CUDA_INC=""
for cand in "$NVCC_BIN_DIR/../include" /usr/local/cuda/include; do
  if [ -f "$cand/cuda_runtime.h" ]; then CUDA_INC="$(readlink -f "$cand")"; break; fi
done
need_pip=1
if [ -n "$CUDA_INC" ] && [ -f "$CUDA_INC/cublas_v2.h" ] && [ -f "$CUDA_INC/cusparse.h" ] && [ -f "$CUDA_INC/cusolverDn.h" ]; then
  need_pip=0
fi
NV_INCS=""
if [ "$need_pip" = 1 ]; then
  NV_INCS="$(nvidia_include_dirs)"
  if [ -z "$NV_INCS" ]; then
    echo "cuda_compile_check: installing cuBLAS/cuSPARSE/cuSOLVER headers from pip (~1 GB)..."
    "$PY" -m pip install -q nvidia-cublas nvidia-cusparse nvidia-cusolver || {
      echo "cuda_compile_check: pip install of the NVIDIA headers failed" >&2
      exit 2
    }
    NV_INCS="$(nvidia_include_dirs)"
  fi
fi

STUB_DIR="$(mktemp -d /tmp/sk_cuda_stub.XXXXXX)"
OBJ_DIR="$(mktemp -d /tmp/sk_cuda_obj.XXXXXX)"
trap 'rm -rf "$STUB_DIR"' EXIT
if [ ! -f "$TORCH_DIR/include/c10/cuda/impl/cuda_cmake_macros.h" ]; then
  mkdir -p "$STUB_DIR/c10/cuda/impl"
  : > "$STUB_DIR/c10/cuda/impl/cuda_cmake_macros.h"
fi

INCS=(-I"$ROOT/csrc/include" -I"$STUB_DIR" -isystem "$TORCH_DIR/include"
      -isystem "$TORCH_DIR/include/torch/csrc/api/include" -isystem "$PY_INC")
for d in $NV_INCS; do INCS+=(-isystem "$d"); done

# The flags torch's cpp_extension passes to nvcc (CUDAExtension), plus setup.py's own.
FLAGS=(-c -std="$STD" -arch="$ARCH" -O3 -lineinfo --expt-relaxed-constexpr
       -DSEQKERNELS_WITH_CUDA=1 -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
       -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__
       --compiler-options "-fPIC -Wall -Wno-unknown-pragmas"
       -Xcudafe --diag_suppress=20012 -Werror all-warnings)
# shellcheck disable=SC2206
FLAGS+=(${EXTRA_NVCC_FLAGS:-})

if [ "$#" -gt 0 ]; then FILES=("$@"); else FILES=(csrc/cuda/*.cu); fi
if [ ! -e "${FILES[0]}" ]; then
  echo "cuda_compile_check: no .cu files to check" >&2
  exit 2
fi

status=0
for f in "${FILES[@]}"; do
  obj="$OBJ_DIR/$(basename "${f%.cu}").o"
  start=$(date +%s)
  if "$NVCC" "${FLAGS[@]}" "${INCS[@]}" "$f" -o "$obj"; then
    echo "OK    $f  ($(( $(date +%s) - start )) s) -> $obj"
  else
    echo "FAIL  $f  ($(( $(date +%s) - start )) s)"
    status=1
  fi
done
exit $status
