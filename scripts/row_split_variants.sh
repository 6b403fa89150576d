#!/usr/bin/env bash
# The row-split forward kernel's diagnostic variants (docs/kernels.md, "The row split"): warp gather
# (SEQKERNELS_LSTM_ROW_SPLIT_WARP_GATHER=1), spread gates (SEQKERNELS_LSTM_ROW_SPLIT_SPREAD_GATES=1) and
# 16 warps (SEQKERNELS_LSTM_ROW_SPLIT_WARPS=16, always with spread gates) on one build (~8 minutes on an
# H200: a device call of its own after the build's):
#   1. their test cases alone (SEQKERNELS_TEST_ROW_SPLIT_VARIANTS=1; a kernel that traps would spoil
#      the rest of a shared pytest process);
#   2. compute-sanitizer memcheck, synccheck and racecheck of sanitize_lstm.py --cluster with warp
#      gather and spread gates on, then with warp gather in 16 warps;
#   3. A/Bs at bf16 / fp16 B = 4, 8, 12, 16, H = 1024 (`infer`, CUDA-graph replays and eager calls):
#      each of warp gather and spread gates 0 / 1 with the other off, warp gather 0 / 1 with spread
#      gates on, and 8 / 16 warps with spread gates on;
#   4. SEQKERNELS_LSTM_TRACE at bf16 B = 8 / 16 for each of the six instances.
# Build first (scripts/gpu_check.sh's build step, e.g. GPU_CHECK_SKIP="<every key but build>").
#
#   OUT=$OUT bash scripts/row_split_variants.sh
#
# Files under $OUT: variants_tests.log, variants_sanitizer.log, variants_ab.log, variants_trace.log.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/row_split_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" PYTHONUNBUFFERED=1
WARP=SEQKERNELS_LSTM_ROW_SPLIT_WARP_GATHER SPREAD=SEQKERNELS_LSTM_ROW_SPLIT_SPREAD_GATES
WARPS=SEQKERNELS_LSTM_ROW_SPLIT_WARPS

SEQKERNELS_TEST_ROW_SPLIT_VARIANTS=1 timeout -k 5 240 "$PY" -m pytest -q -m cuda -p no:cacheprovider -rfE \
  tests/test_lstm_backends.py -k row_split >"$OUT/variants_tests.log" 2>&1
echo "rc=$?" >>"$OUT/variants_tests.log"

: >"$OUT/variants_sanitizer.log"
for setting in "$SPREAD=1" "$WARPS=16"; do
  for tool in memcheck synccheck racecheck; do
    echo "=== $tool ($WARP=1 $setting)" >>"$OUT/variants_sanitizer.log"
    env "$WARP=1" "$setting" PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 5 150 compute-sanitizer --tool "$tool" \
      --error-exitcode 99 "$PY" scripts/sanitize_lstm.py --cluster 2>&1 | grep -v "^ok " >>"$OUT/variants_sanitizer.log"
    echo "rc=${PIPESTATUS[0]}" >>"$OUT/variants_sanitizer.log"
  done
done

: >"$OUT/variants_ab.log"
ab() {  # ab EXTRA_ENV SWITCH SETTING SETTING: the switch's two settings with EXTRA_ENV (VAR=value) set
  echo "=== $1: $2 $3 / $4" >>"$OUT/variants_ab.log"
  env "$1" OUT="$OUT/ab" AB_ROUNDS=2 AB_ARGS="--batch 4 8 12 16 --hidden 1024 --dtype bfloat16 float16" \
    timeout -k 5 150 bash scripts/ab_switch.sh "$2" "$3" "$4" 2>&1 | grep -v "^ab_time_lstm:" >>"$OUT/variants_ab.log"
}
ab "$SPREAD=0" "$WARP" 0 1
ab "$WARP=0" "$SPREAD" 0 1
ab "$SPREAD=1" "$WARP" 0 1
ab "$SPREAD=1" "$WARPS" 8 16
rm -rf "$OUT/ab"

: >"$OUT/variants_trace.log"
for warps in 8 16; do
  for warp in 0 1; do
    for spread in 0 1; do
      [ "$warps" = 16 ] && [ "$spread" = 0 ] && continue  # 16 warps always spread the gates
      echo "=== $WARPS=$warps $WARP=$warp $SPREAD=$spread" >>"$OUT/variants_trace.log"
      env "$WARPS=$warps" "$WARP=$warp" "$SPREAD=$spread" SEQKERNELS_LSTM_TRACE=1 timeout -k 5 60 "$PY" \
        scripts/lstm_trace.py --cases bf16:8:1024 bf16:16:1024 >>"$OUT/variants_trace.log" 2>&1
    done
  done
done
