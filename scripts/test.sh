#!/usr/bin/env bash
# Sets up a fresh machine and runs the test suite:
#   installs torch (exact pin, CPU build on a machine without an NVIDIA GPU) if no torch is
#   installed, the test tools and ninja, builds seqkernels in place against that torch
#   (no build isolation, no dependency resolution), then runs `python -m pytest -q`.
# Idempotent: run it again after editing the C++ and it rebuilds what changed and retests.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k compile -x
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
    echo "test.sh: using the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
    return
  fi
  local spec
  if has_nvidia_gpu; then
    spec="torch==${TORCH_VERSION}"        # the registry's default build is the CUDA one
  else
    spec="torch==${TORCH_VERSION}+cpu"    # CPU build only: never the multi-GB CUDA build
  fi
  echo "test.sh: no torch installed; installing ${spec}"
  if ! pip_install "$spec"; then
    echo "test.sh: could not install ${spec}. The CPU build lives on PyTorch's CPU index:" >&2
    echo "  PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash $0" >&2
    exit 1
  fi
  if ! has_nvidia_gpu && [ "$("$PY" -c 'import torch; print(torch.version.cuda)')" != "None" ]; then
    echo "test.sh: a CUDA build of torch was installed on a machine without a GPU; refusing to go on" >&2
    exit 1
  fi
}

install_tools() {
  # The build backend must be here already (no build isolation): setuptools >= 70.1,
  # which carries bdist_wheel itself (PEP 660 editable installs need it).
  "$PY" -c "import sys, setuptools; v = tuple(int(p) for p in setuptools.__version__.split('.')[:2]); sys.exit(v < (70, 1))" >/dev/null 2>&1 || pip_install "setuptools>=70.1"
  # numpy: torch warns at import without it, and torch.compile/tests may use it.
  "$PY" -c "import pytest, hypothesis, ninja, numpy" >/dev/null 2>&1 || pip_install pytest hypothesis ninja numpy
}

build() {
  # --no-build-isolation: build against the torch installed above (an isolated build would
  # download another torch); --no-deps: never let pip resolve torch again.
  echo "test.sh: building seqkernels (pip install --no-build-isolation --no-deps -e .)"
  local t0=$SECONDS
  pip_install --no-build-isolation --no-deps -e .
  echo "test.sh: build done in $((SECONDS - t0)) s"
  "$PY" -c "import seqkernels, torch; print('test.sh: seqkernels', seqkernels.__version__, 'on torch', torch.__version__)"
}

install_torch
install_tools
build

set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
