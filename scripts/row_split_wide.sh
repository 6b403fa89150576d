#!/usr/bin/env bash
# The wide row split (the row-split forward kernel at 16 < B <= 64, H = 1024, 16-bit types, in 2 / 4
# n8 tiles of rows a block; the rule since 2026-11-28, SEQKERNELS_LSTM_ROW_SPLIT_WIDE=0 gives those
# calls back to the cluster kernel; docs/kernels.md, "The row split") in one device call after the
# build's (each step time-boxed; about 5 minutes on an H200):
#   1. its tests alone (test_row_split_wide_*);
#   2. compute-sanitizer memcheck, synccheck and racecheck of sanitize_lstm.py --cluster (fp16 B = 20
#      and bf16 B = 40 at H = 1024 run it);
#   3. the A/B of the switch against the cluster kernel: bf16 / fp16 B = 17, 24, 32, 48, 64,
#      H = 1024, `infer` (CUDA-graph replays and eager calls), then bf16 B = 32 / 64 `train`;
#   4. SEQKERNELS_LSTM_TRACE at bf16 B = 32 / 64 with the switch off and on.
# Build first (scripts/gpu_check.sh's build step, e.g. GPU_CHECK_SKIP="<every key but build>").
#
#   OUT=$OUT bash scripts/row_split_wide.sh
#
# Files under $OUT: wide_tests.log, wide_sanitizer.log, wide_ab.log, wide_trace.log.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/row_split_wide_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" PYTHONUNBUFFERED=1
WIDE=SEQKERNELS_LSTM_ROW_SPLIT_WIDE

timeout -k 5 120 "$PY" -m pytest -q -m cuda -p no:cacheprovider -rfE \
  tests/test_lstm_backends.py -k row_split_wide >"$OUT/wide_tests.log" 2>&1
echo "rc=$?" >>"$OUT/wide_tests.log"

: >"$OUT/wide_sanitizer.log"
for tool in memcheck synccheck racecheck; do
  echo "=== $tool" >>"$OUT/wide_sanitizer.log"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 5 150 compute-sanitizer --tool "$tool" \
    --error-exitcode 99 "$PY" scripts/sanitize_lstm.py --cluster 2>&1 | grep -v "^ok " >>"$OUT/wide_sanitizer.log"
  echo "rc=${PIPESTATUS[0]}" >>"$OUT/wide_sanitizer.log"
done

: >"$OUT/wide_ab.log"
for args in "--batch 17 24 32 48 64 --hidden 1024 --dtype bfloat16 float16" \
  "--batch 32 64 --hidden 1024 --dtype bfloat16 --mode train"; do
  echo "=== $WIDE 0 / 1: $args" >>"$OUT/wide_ab.log"
  OUT="$OUT/ab" AB_ROUNDS=2 AB_ARGS="$args" timeout -k 5 150 bash scripts/ab_switch.sh "$WIDE" 0 1 2>&1 |
    grep -v "^ab_time_lstm:" >>"$OUT/wide_ab.log"
done
rm -rf "$OUT/ab"

: >"$OUT/wide_trace.log"
for wide in 0 1; do
  echo "=== $WIDE=$wide" >>"$OUT/wide_trace.log"
  env "$WIDE=$wide" SEQKERNELS_LSTM_TRACE=1 timeout -k 5 60 "$PY" scripts/lstm_trace.py \
    --cases bf16:32:1024 bf16:64:1024 >>"$OUT/wide_trace.log" 2>&1
done
