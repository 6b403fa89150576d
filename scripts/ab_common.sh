# Sourced by scripts/ab_builds.sh and scripts/ab_switch.sh: their settings and timing rounds.
# Env: AB_ROUNDS (default 2), AB_ARGS (scripts/ab_time_lstm.py's cell arguments), OUT (ab.jsonl and
# logs; default ./ab_out).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/ab_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
ROUNDS="${AB_ROUNDS:-2}"

# ab_run: ROUNDS rounds of one scripts/ab_time_lstm.py process per variant, the variants in turn,
# then scripts/ab_table.py's table. Variant i imports the build in AB_TREES[i], runs with the
# env(1) arguments in AB_ENVS[i] (words: e.g. "-u NAME" or "NAME=value", or empty) and is called
# AB_LABELS[i] in the table.
ab_run() {
  : >"$OUT/ab.jsonl"
  local r i
  for r in $(seq 1 "$ROUNDS"); do
    for i in "${!AB_TREES[@]}"; do
      # shellcheck disable=SC2086
      env ${AB_ENVS[$i]} PYTHONPATH="${AB_TREES[$i]}${PYTHONPATH:+:$PYTHONPATH}" "$PY" \
        "$ROOT/scripts/ab_time_lstm.py" --tag "t$i.r$r" --expect "${AB_TREES[$i]}" ${AB_ARGS:-} >>"$OUT/ab.jsonl" ||
        return 1
    done
  done
  "$PY" "$ROOT/scripts/ab_table.py" "$OUT/ab.jsonl" "$ROUNDS" "${AB_LABELS[@]}"
}
