#!/usr/bin/env bash
# A/B of seqkernels builds in one call (a device call, or here on the CPU): builds each tree in
# place, in parallel, then times each with scripts/ab_time_lstm.py, the trees alternating in
# every round, and prints a table (ms; for CUDA `infer` the CUDA-graph replay, then the eager
# call). Each timing process imports only its own tree's build, which ab_time_lstm.py checks.
#
#   scripts/ab_tree.sh HEAD ab_old            # a tree of a commit (untracked, so it travels
#   scripts/ab_builds.sh ab_old .             # with a device call); "." is the working tree
#   AB_ROUNDS=3 AB_ARGS="--dtype float32 --hidden 1024" scripts/ab_builds.sh ab_old .
#
# Env: AB_ROUNDS (default 2), AB_ARGS (ab_time_lstm.py's cell arguments), AB_JOBS (compile jobs
# per tree, default: the cores shared out), OUT (logs and ab.jsonl; default ./ab_out).
# On the GPU machine: TORCH_CUDA_ARCH_LIST=9.0 is set here unless given, and missing Python
# wheels (hypothesis is not needed) are not installed.
# shellcheck source=scripts/ab_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab_common.sh"
[ "$#" -ge 1 ] || { echo "usage: scripts/ab_builds.sh TREE [TREE ...]" >&2; exit 2; }
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"

TREES=()
for t in "$@"; do
  [ -f "$t/setup.py" ] || { echo "ab_builds: $t has no setup.py" >&2; exit 2; }
  TREES+=("$(cd "$t" && pwd)")
done
JOBS="${AB_JOBS:-$(( ($(nproc) + ${#TREES[@]} - 1) / ${#TREES[@]} ))}"

PIDS=()
i=0
for t in "${TREES[@]}"; do
  (cd "$t" && MAX_JOBS="$JOBS" "$PY" setup.py build_ext --inplace >"$OUT/build_$i.log" 2>&1) &
  PIDS+=("$!")
  i=$((i + 1))
done
# A failed build may leave an older _C behind: its exit status decides, not the file.
failed=0
for i in "${!TREES[@]}"; do
  if ! wait "${PIDS[$i]}"; then
    echo "ab_builds: the build of ${TREES[$i]} failed (tail of $OUT/build_$i.log):" >&2
    tail -20 "$OUT/build_$i.log" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1

AB_TREES=("${TREES[@]}")
AB_ENVS=()
for _ in "${TREES[@]}"; do AB_ENVS+=(""); done
AB_LABELS=("${TREES[@]}")
ab_run || exit 1
