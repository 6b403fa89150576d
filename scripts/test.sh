#!/usr/bin/env bash
# Sets up a fresh machine and runs the test suite: torch (exact pin, CPU build on a machine
# without an NVIDIA GPU) if none is installed, pytest, hypothesis, ninja, numpy and matplotlib
# (the optional plot extra, so that the benchmarks' --plot is tested), an
# in-place build of seqkernels (scripts/setup_env.sh), then `python -m pytest -q`.
# Idempotent: run it again after editing the C++ and it rebuilds what changed and retests.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k compile -x
# Environment: see scripts/setup_env.sh; HYPOTHESIS_PROFILE=ci|dev|thorough.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SETUP_NAME=test.sh
source scripts/setup_env.sh
setup_seqkernels pytest hypothesis ninja numpy matplotlib

set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
