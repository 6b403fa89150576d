# Shared set-up of scripts/test.sh and scripts/bench.sh (sourced, not run). On a fresh
# machine: installs torch if no torch is installed (an exact pin; the CPU build where there
# is no NVIDIA GPU, so pip never pulls the multi-GB CUDA build), the build backend and the
# packages the caller names, then builds seqkernels in place against that torch, without
# build isolation and without dependency resolution. Idempotent. Messages go to stderr.
#
#   SETUP_NAME=test.sh; source scripts/setup_env.sh; setup_seqkernels pytest hypothesis ninja numpy matplotlib
#
# Environment: PYTHON (default python3), SEQKERNELS_TORCH_VERSION (default 2.13.0), and the
# build's SEQKERNELS_CUDA / DEBUG / TORCH_CUDA_ARCH_LIST / MAX_JOBS (see README.md).

PY=${PYTHON:-python3}
TORCH_VERSION=${SEQKERNELS_TORCH_VERSION:-2.13.0}
SETUP_NAME=${SETUP_NAME:-setup_env.sh}
# Tools that pip installs (ninja, pytest) land beside the interpreter: make them findable.
PATH="$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
export PATH

setup_log() { echo "$SETUP_NAME: $*" >&2; }
pip_install() { "$PY" -m pip install --disable-pip-version-check --progress-bar off "$@" >&2; }
has_nvidia_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

install_torch() {
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    setup_log "using the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
    return
  fi
  local spec
  if has_nvidia_gpu; then
    spec="torch==${TORCH_VERSION}"        # the registry's default build is the CUDA one
  else
    spec="torch==${TORCH_VERSION}+cpu"    # CPU build only: never the multi-GB CUDA build
  fi
  setup_log "no torch installed; installing ${spec}"
  if ! pip_install "$spec"; then
    setup_log "could not install ${spec}. The CPU build lives on PyTorch's CPU index:"
    setup_log "  PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash $0"
    exit 1
  fi
  if ! has_nvidia_gpu && [ "$("$PY" -c 'import torch; print(torch.version.cuda)')" != "None" ]; then
    setup_log "a CUDA build of torch was installed on a machine without a GPU; refusing to go on"
    exit 1
  fi
}

# install_tools MODULE...: the build backend, plus the named packages (import name = pip name).
install_tools() {
  # No build isolation, so the build backend must be here already: setuptools >= 70.1,
  # which carries bdist_wheel itself (PEP 660 editable installs need it).
  "$PY" -c "import sys, setuptools; v = tuple(int(p) for p in setuptools.__version__.split('.')[:2]); sys.exit(v < (70, 1))" >/dev/null 2>&1 || pip_install "setuptools>=70.1"
  local modules
  modules=$(IFS=,; echo "$*")
  "$PY" -c "import $modules" >/dev/null 2>&1 || pip_install "$@"
}

build_seqkernels() {
  # --no-build-isolation: build against the torch above; --no-deps: never resolve torch again.
  setup_log "building seqkernels (pip install --no-build-isolation --no-deps -e .)"
  local t0=$SECONDS
  pip_install --no-build-isolation --no-deps -e .
  setup_log "build done in $((SECONDS - t0)) s"
  "$PY" -c "import seqkernels, torch; print('$SETUP_NAME: seqkernels', seqkernels.__version__, 'on torch', torch.__version__)" >&2
}

setup_seqkernels() {
  install_torch
  install_tools "$@"
  build_seqkernels
}
