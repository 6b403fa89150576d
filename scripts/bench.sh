#!/usr/bin/env bash
# Sets up a fresh machine and runs the LSTM benchmark on the default device (the GPU if
# there is one, else the CPU): torch (exact pin, CPU build on a machine without an NVIDIA
# GPU) if none is installed, ninja and numpy, an in-place build of seqkernels
# (scripts/setup_env.sh), then `python benchmarks/bench_lstm.py`. Idempotent.
# Extra arguments go to the benchmark, e.g.  bash scripts/bench.sh --quick
#                                            bash scripts/bench.sh --markdown docs/table.md
# Results: the table on stdout (set-up and progress on stderr), JSON in
# bench_results/lstm_<device>.json. Environment: see scripts/setup_env.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SETUP_NAME=bench.sh
source scripts/setup_env.sh
setup_seqkernels ninja numpy

exec "$PY" benchmarks/bench_lstm.py "$@"
