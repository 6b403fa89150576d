// The steps of a packed sequence as the persistent kernels read them: runs of equal batch size,
// passed by value in a kernel's arguments (the persistent kernels copy it into shared memory; the
// one-cluster kernels read it from their parameters).
//
// Shape legend: T steps, batch_sizes[t] rows at step t (never growing with t), packed row
// offsets[t] + b for batch row b < batch_sizes[t].
#pragma once

#include <climits>
#include <cstdint>

#include "seqkernels/lstm_checks.h"

namespace seqkernels {
namespace cuda {

constexpr int kMaxSegments = 64;  // distinct batch sizes of a packed sequence

// Runs of equal batch size: step t in [tb[k], tb[k+1]) has bs[k] rows starting at packed row
// ob[k] + (t - tb[k]) * bs[k]. tb[count] = T.
struct SegTable {
  long long ob[kMaxSegments];
  int tb[kMaxSegments + 1];
  int bs[kMaxSegments];
  int count;
  int pad_;
};

// One step of the packed sequence.
struct StepInfo {
  int t, bt;
  int64_t off;  // first packed row of the step
};

// Step t's rows; k is the caller's cursor into the runs (moved to t's run: steps are walked in order).
__device__ __forceinline__ StepInfo step_at(const SegTable* seg, int t, int& k) {
  while (t < seg->tb[k]) --k;
  while (t >= seg->tb[k + 1]) ++k;
  const int bt = seg->bs[k];
  return {t, bt, seg->ob[k] + static_cast<int64_t>(t - seg->tb[k]) * bt};
}

// The packed row whose state row b of step t starts from, for a backward pass: step t - 1's (every
// row of step t runs there) or, in reverse, step t + 1's where row b runs there; -1 where the row
// starts from h0 / c0. k: the caller's cursor, not moved.
__device__ __forceinline__ int64_t previous_row(const SegTable* seg, int T, bool reverse, int t, int b, int k) {
  if (!reverse && t > 0) return step_at(seg, t - 1, k).off + b;
  if (reverse && t + 1 < T) {
    const StepInfo next = step_at(seg, t + 1, k);
    if (b < next.bt) return next.off + b;
  }
  return -1;
}

// The table of s's steps; false where T or the number of distinct batch sizes is beyond it.
inline bool build_segments(const LstmSizes& s, SegTable& tab) {
  if (s.T > INT_MAX - 1) return false;
  tab = SegTable{};
  tab.count = 0;
  for (int64_t t = 0; t < s.T; ++t) {
    if (t == 0 || s.batch_sizes[t] != s.batch_sizes[t - 1]) {
      if (tab.count == kMaxSegments) return false;
      tab.tb[tab.count] = static_cast<int>(t);
      tab.bs[tab.count] = static_cast<int>(s.batch_sizes[t]);
      tab.ob[tab.count] = s.offsets[t];
      ++tab.count;
    }
  }
  tab.tb[tab.count] = static_cast<int>(s.T);
  return true;
}

}  // namespace cuda
}  // namespace seqkernels
