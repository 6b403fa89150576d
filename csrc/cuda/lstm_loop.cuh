// Which time loop a CUDA LSTM op runs: SEQKERNELS_LSTM_BACKEND, and under `auto` the
// selection heuristic, decided once per op call by csrc/cuda/lstm.cu. The forward and the
// backward op choose independently. seqkernels/_config.py (lstm_loop_choice) mirrors this
// function for `python -m seqkernels --batch B --hidden H`; change both together.
#pragma once

#include <cstdint>

#include "seqkernels/lstm_backend.h"
#include "seqkernels/lstm_checks.h"

namespace seqkernels {
namespace cuda {

enum class Loop {
  kPersistent,  // lstm_persistent.cu: one cooperative kernel for the whole sequence
  kFused,       // lstm_fused_step.cu: one GEMM + gate kernel per step, steps overlapped (PDL)
  kCublas,      // lstm.cu: a cuBLAS GEMM and a pointwise kernel per step (handles everything)
};

// Thresholds of the auto heuristic (bytes of the recurrent state B·H·sizeof(dtype), and B·H).
constexpr int64_t kPersistentMaxForwardState = 64 * 1024;  // persistent forward, up to this state
constexpr int64_t kPersistentMaxBackwardState = 32 * 1024;  // ... backward (FMA dtypes)
constexpr int64_t kPersistentMaxBackwardStateMma = 8 * 1024;  // ... backward (tensor-core dtypes)
constexpr int64_t kPersistentMaxForwardBatchHalf = 8;  // persistent forward, 16-bit dtypes: B <= 8
constexpr int64_t kPersistentMaxForwardBatchTf32 = 16;  // ... TF32: B <= 16
constexpr int64_t kFusedMaxForwardBH = 64 * 1024;  // fused forward: B·H <= 65536
constexpr int64_t kFusedMaxBackwardBatch = 64;  // fused backward: B <= 64
constexpr int64_t kFusedMaxHiddenTf32 = 512;  // fused, TF32: H <= 512

// The loop for one op call. `mma`: the dtype runs on tensor cores (bf16, fp16, or float32 with
// TF32 allowed); `half`: a 16-bit dtype. A forced loop that does not apply to the call (e.g.
// persistent with a projection, fused in float64) leaves it to the cuBLAS loop.
//
// auto (measured on an H200, 2026-11-24, T = 256, every loop forced in one process,
// scripts/lstm_backend_grid.py; docs/kernels.md has the table):
//  - projection: cuBLAS (the only loop that has one);
//  - tensor-core dtypes: the persistent loop's per-step cost grows with the state it exchanges
//    between all blocks every step, the fused loop's is ~4 µs nearly flat up to B·H = 64K and
//    then grows with the A operand every block re-reads (B·K per block), the cuBLAS loop's is
//    ~12 µs flat and wins for large B·H. Forward: persistent for B <= 8 (16-bit) or B <= 16
//    (TF32), within 64 KiB of state; fused while B·H <= 65536 (TF32: and H <= 512); else
//    cuBLAS. Backward: persistent while the state is <= 8 KiB; fused while B <= 64 (TF32: and
//    H <= 512: its dG operand is 4·H fp32 values a row, its W slice 128 KiB at H = 1024); else
//    cuBLAS.
//  - float32 with TF32 off, float64 (no fused loop): persistent while the state is <= 64 KiB
//    (forward) / 32 KiB (backward), else cuBLAS (measured 2026-11-21, docs/kernels.md).
inline Loop choose_loop(const LstmSizes& s, int64_t elem_size, bool mma, bool half, bool backward) {
  switch (lstm_backend_from_env()) {  // validated on every call
    case LstmBackend::kGemm:
      return Loop::kCublas;
    case LstmBackend::kPersistent:
      return Loop::kPersistent;
    case LstmBackend::kFused:
      return Loop::kFused;
    case LstmBackend::kAuto:
      break;
  }
  if (s.P > 0) return Loop::kCublas;
  const int64_t state = s.B * s.H * elem_size;
  if (!mma) {
    return state <= (backward ? kPersistentMaxBackwardState : kPersistentMaxForwardState) ? Loop::kPersistent
                                                                                            : Loop::kCublas;
  }
  if (backward) {
    if (state <= kPersistentMaxBackwardStateMma) return Loop::kPersistent;
    if (s.B <= kFusedMaxBackwardBatch && (half || s.H <= kFusedMaxHiddenTf32)) return Loop::kFused;
    return Loop::kCublas;
  }
  const int64_t max_batch = half ? kPersistentMaxForwardBatchHalf : kPersistentMaxForwardBatchTf32;
  if (s.B <= max_batch && state <= kPersistentMaxForwardState) return Loop::kPersistent;
  if (s.B * s.H <= kFusedMaxForwardBH && (half || s.H <= kFusedMaxHiddenTf32)) return Loop::kFused;
  return Loop::kCublas;
}

}  // namespace cuda
}  // namespace seqkernels
