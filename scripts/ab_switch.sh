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
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/ab_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
ROUNDS="${AB_ROUNDS:-2}"
[ "$#" -ge 2 ] || { echo "usage: scripts/ab_switch.sh VARIABLE SETTING [SETTING ...]  (- for unset)" >&2; exit 2; }
VAR="$1"
shift
LABELS=()
for v in "$@"; do LABELS+=("$VAR=$v"); done

: >"$OUT/ab.jsonl"
for r in $(seq 1 "$ROUNDS"); do
  i=0
  for v in "$@"; do
    if [ "$v" = "-" ]; then setting=(-u "$VAR"); else setting=("$VAR=$v"); fi
    # shellcheck disable=SC2086
    env "${setting[@]}" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$ROOT/scripts/ab_time_lstm.py" \
      --tag "t$i.r$r" --expect "$ROOT" ${AB_ARGS:-} >>"$OUT/ab.jsonl" || exit 1
    i=$((i + 1))
  done
done

"$PY" "$ROOT/scripts/ab_table.py" "$OUT/ab.jsonl" "$ROUNDS" "${LABELS[@]}"
