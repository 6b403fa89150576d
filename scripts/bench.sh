#!/usr/bin/env bash
# Sets up a fresh machine and runs the LSTM benchmark on the default device (the GPU if
# there is one, else the CPU):
#   installs torch (exact pin, CPU build on a machine without an NVIDIA GPU) if no torch is
#   installed, and ninja, builds seqkernels in place against that torch, then runs
#   `python benchmarks/bench_lstm.py`. Idempotent.
# Extra arguments go to the benchmark, e.g.  bash scripts/bench.sh --quick
#                                            bash scripts/bench.sh --markdown docs/table.md
# Results: the table on stdout, JSON in bench_results/lstm_<device>.json.
# Environment: PYTHON (default python3), SEQKERNELS_TORCH_VERSION (default 2.13.0), and the
# build's SEQKERNELS_CUDA / DEBUG / TORCH_CUDA_ARCH_LIST / MAX_JOBS (see README.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-python3}
TORCH_VERSION=${SEQKERNELS_TORCH_VERSION:-2.13.0}
# Tools that pip installs (ninja, pytest) land beside the interpreter: make them findable.
PATH="$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
export PATH
pip_install() { "$PY" -m pip install --disable-pip-version-check --progress-bar off "$@"; }

has_nvidia_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

install_torch() {
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "bench.sh: using the installed torch $("$PY" -c 'import torch; print(torch.__version__)')" >&2
    return
  fi
  local spec
  if has_nvidia_gpu; then
    spec="torch==${TORCH_VERSION}"        # the registry's default build is the CUDA one
  else
    spec="torch==${TORCH_VERSION}+cpu"    # CPU build only: never the multi-GB CUDA build
  fi
  echo "bench.sh: no torch installed; installing ${spec}" >&2
  if ! pip_install "$spec" >&2; then
    echo "bench.sh: could not install ${spec}. The CPU build lives on PyTorch's CPU index:" >&2
    echo "  PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash $0" >&2
    exit 1
  fi
  if ! has_nvidia_gpu && [ "$("$PY" -c 'import torch; print(torch.version.cuda)')" != "None" ]; then
    echo "bench.sh: a CUDA build of torch was installed on a machine without a GPU; refusing to go on" >&2
    exit 1
  fi
}

install_tools() {
  # The build backend must be here already (no build isolation): setuptools >= 70.1,
  # which carries bdist_wheel itself (PEP 660 editable installs need it).
  "$PY" -c "import sys, setuptools; v = tuple(int(p) for p in setuptools.__version__.split('.')[:2]); sys.exit(v < (70, 1))" >/dev/null 2>&1 || pip_install "setuptools>=70.1" >&2
  "$PY" -c "import ninja, numpy" >/dev/null 2>&1 || pip_install ninja numpy >&2
}

build() {
  # --no-build-isolation: build against the torch above; --no-deps: never resolve torch again.
  echo "bench.sh: building seqkernels (pip install --no-build-isolation --no-deps -e .)" >&2
  pip_install --no-build-isolation --no-deps -e . >&2
}

install_torch
install_tools
build
# Progress goes to stderr, the table to stdout.
exec "$PY" benchmarks/bench_lstm.py "$@"
