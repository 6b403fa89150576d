#!/usr/bin/env bash
# A/B of the settings of one environment variable (a diagnostic switch) on one build, in one call:
# times each setting with scripts/ab_time_lstm.py in its own process, the settings alternating in
# every round, and prints scripts/ab_table.py's table (ms; for CUDA `infer` the CUDA-graph replay,
# then the eager call). The extension must be built already (scripts/gpu_check.sh's build step).
#
#   AB_ROUNDS=3 AB_ARGS="--dtype float32 --hidden 1024" scripts/ab_switch.sh SEQKERNELS_LSTM_CLUSTER_HALF - 0
#
# A setting "-" leaves the variable unset. Env: AB_ROUNDS (default 2), AB_ARGS (ab_time_lstm.py's
# cell arguments), OUT (ab.jsonl; default ./ab_out).
# shellcheck source=scripts/ab_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab_common.sh"
[ "$#" -ge 2 ] || { echo "usage: scripts/ab_switch.sh VARIABLE SETTING [SETTING ...]  (- for unset)" >&2; exit 2; }
VAR="$1"
shift
AB_TREES=() AB_ENVS=() AB_LABELS=()
for v in "$@"; do
  AB_TREES+=("$ROOT")
  if [ "$v" = "-" ]; then AB_ENVS+=("-u $VAR"); else AB_ENVS+=("$VAR=$v"); fi
  AB_LABELS+=("$VAR=$v")
done
ab_run || exit 1
