// Which time loop a CUDA LSTM op runs: SEQKERNELS_LSTM_BACKEND, and under `auto` the
// selection heuristic, decided once per op call by csrc/cuda/lstm.cu. The forward and the
// backward op choose independently. seqkernels/_config.py (lstm_loop_choice) mirrors this
// function for `python -m seqkernels --batch B --hidden H`; change both together.
#pragma once

#include <cstdint>

#include "lstm_persistent.cuh"
#include "replayed_steps.cuh"
#include "seqkernels/lstm_backend.h"
#include "seqkernels/lstm_checks.h"

namespace seqkernels {
namespace cuda {

enum class Loop {
  kPersistent,  // lstm_persistent.cu: one cooperative kernel for the whole sequence
  kFused,       // lstm_fused_step.cu: one GEMM + gate kernel per step, steps overlapped (PDL)
  kCublas,      // lstm.cu: a cuBLAS GEMM and a pointwise kernel per step (handles everything)
};

// Thresholds of the auto heuristic (state = B·H·sizeof(dtype) bytes, the recurrent state).
constexpr int64_t kPersistentMaxForwardState = 64 * 1024;  // persistent forward, float64 and TF32
constexpr int64_t kPersistentMaxBackwardState = 32 * 1024;  // persistent backward, float64
// float32 with TF32 off (re-measured 2026-11-26 on an H200 after the direct forward kernel and the
// fused loop took it, three TF32 MMAs per product; every loop forced, docs/kernels.md):
//  - forward: persistent at B <= 16; fused at B > 16 with H <= 512 and B·H <= 32768 (`infer`
//    B = 32, H = 512 2.31 ms fused against 2.95 persistent, 5.91 cuBLAS; B = 64, H = 256 1.90
//    against 2.65); else cuBLAS, whose forward steps from B = 17 are split TF32 GEMMs (lstm.cu's
//    x3 steps; grid of 2026-11-26, the seventh session: B = 32, H = 1024 4.47 ms against 6.05
//    persistent, 6.96 fused; B = 64, H = 1024 6.40 against 11.25 fused; the persistent loop
//    had won at B = 32 before them, 6.57 against 8.07);
//  - backward (`train` minus `infer` under each loop): persistent at B <= 8 with H <= 512 (B = 8,
//    H = 512 2.43 ms against 2.49 fused, 3.09 cuBLAS); fused at 8 <= B <= 16 and at B·H <= 8192
//    (B = 16, H = 512 2.84 against 3.15 cuBLAS, 3.75 persistent; B = 8, H = 1024 4.60 against
//    5.60 cuBLAS, 5.80 persistent; B = 32, H = 256 2.61 against 2.75); else cuBLAS (B = 1,
//    H = 1024 2.81 against 3.46 fused, 4.18 persistent; B = 32, H = 512 3.88 against 4.45 fused).
constexpr int64_t kFusedMaxForwardHiddenFp32 = 512;  // fused forward, B > 16: H <= 512, B·H <= kFusedMaxForwardBH
constexpr int64_t kPersistentMaxBackwardBatchFp32 = 8;    // persistent backward: B <= 8 and ...
constexpr int64_t kPersistentMaxBackwardHiddenFp32 = 512;  // ... H <= 512
constexpr int64_t kFusedMinBackwardBatchFp32 = 8;   // fused backward: B >= 8 and (B <= 16 or ...
constexpr int64_t kFusedMaxBackwardBatchFp32 = 16;
constexpr int64_t kFusedMaxBackwardBHFp32 = 8 * 1024;  // ... B·H <= 8192)
constexpr int64_t kPersistentMaxStateMma = 8 * 1024;  // persistent, tensor cores (but TF32 forward)
constexpr int64_t kPersistentMaxForwardBatchMma = 16;  // persistent forward, tensor cores: B <= 16 and ...
constexpr int64_t kPersistentMaxForwardHiddenHalf = 1024;  // ... H <= 1024 (16-bit) or the state <= 64 KiB (TF32)
// Backward, TF32, beyond the 8 KiB state (the split backward kernel, H <= kSplitBackwardMaxHidden):
// persistent at B <= 4, at B <= 16 above the fused loop's H limit (B <= 5 above
// kFusedBackwardWideHiddenTf32), and (since its clustered instances, 2026-11-26) at B <= 16 with
// H % 32 == 0; fused while B·H <= 8192 and H <= 768, and at 5 < B <= 16 above
// kFusedBackwardWideHiddenTf32 (H <= 1024). H % 32 == 0 makes the block count (H / 4 or H / 8) a
// multiple of 8 or 4, so that the split kernel can run in clusters (lstm_persistent_backward.cu);
// the rule was measured at H = 256, 512, 768. At H = 1024 the split kernel's 128 blocks fit no
// cluster, and the fused backward, with 8 units per block and its W slice read from L2 there
// (lstm_fused_step.cu, plan_geometry), is the faster loop from B = 6 (backward op, H200,
// 2026-11-26: B = 6 / 8 / 16 2.85 / 2.87 / 3.25 ms against 2.90 / 3.07 / 4.25; B = 5 2.73 against
// 2.73; B = 4 2.76 against 2.46). At H = 896 the split kernel wins to B = 8 (2.38 against 2.71);
// the fused loop was 3-4 % faster at B = 12 / 16, which the rule leaves to the split kernel.
// Whether the cuBLAS loop's dh GEMM can run on scaled fp16 operands (lstm.cu, HalfDhStep, in
// k_parts K parts): each row part's U = H / k_parts units are one block of whole warps, 64 to 256
// (lstm.cu's block size) of them; with 32-unit blocks it was no faster (docs/benchmarks.md).
constexpr int64_t kHalfDhMinUnits = 64;
constexpr int64_t kHalfDhMaxUnits = 256;
inline bool half_dh_units_fit(int64_t H, int64_t k_parts) {
  const int64_t U = H / k_parts;
  return H % k_parts == 0 && U % 32 == 0 && U >= kHalfDhMinUnits && U <= kHalfDhMaxUnits;
}
// Since that dh GEMM runs on scaled fp16 operands (4 K parts from B = 8, lstm.cu's step_k_parts;
// above H = 896 they fit at H = 1024 only), the cuBLAS loop takes the TF32 backward there from B = 8
// (H200, 2026-11-27, nineteenth session, `train` minus `infer` eager ms, auto's fused backward
// against the cuBLAS loop's: B = 8 2.52 / 2.28, B = 16 3.05 / 2.53; the backward op alone at B = 8 /
// 12 / 16 2.75 / 3.04 / 3.22 against 2.65 / 2.77 / 2.85; docs/benchmarks.md). At H = 512 the other
// loops stayed faster (B = 8 / 16: 1.39 / 1.76 against 1.92 / 2.04).
constexpr int64_t kCublasMinBackwardBatchTf32Wide = 8;
constexpr int64_t kHalfDhParts = 4;
constexpr int64_t kPersistentBackwardSmallBatchTf32 = 4;
constexpr int64_t kPersistentMaxBackwardBatchTf32 = 16;
constexpr int64_t kFusedMaxBackwardHiddenTf32 = 768;
constexpr int64_t kFusedBackwardWideHiddenTf32 = 896;
constexpr int64_t kPersistentMaxBackwardBatchTf32Wide = 5;
constexpr int64_t kClusterHiddenMultiple = 32;
// Backward, 16-bit, beyond the 8 KiB state: persistent (the split backward kernel in clusters)
// while B <= 16, B·H <= 8192, H <= 768 and H % 32 == 0 (at H = 1024 its 128 blocks do not fit in
// clusters on an H200, and B = 16, H = 768 was faster on the fused loop).
// And wherever the row-split backward kernel applies (`row_split_backward`: 16-bit, H = 1024,
// B <= 16, equal batch sizes, sm_90 with >= 128 SMs; lstm_persistent.cuh): backward op, H200
// (2026-11-28, thirty-eighth session, ms, row split / the persistent loop without it (split or
// general kernel) / fused): bf16 B = 1 1.048 / 1.407 / 1.791, B = 2 1.021 / 1.749 / 1.868, B = 4
// 1.083 / 2.017 / 1.881, B = 8 1.317 / 2.583 / 2.044, B = 12 1.657 / 3.062 / 2.208, B = 16 1.818 /
// 3.393 / 2.334; fp16 within 0.07 ms of those.
constexpr int64_t kPersistentMaxBackwardBatchHalf = 16;
constexpr int64_t kPersistentMaxBackwardBHHalf = 8 * 1024;
constexpr int64_t kPersistentMaxBackwardHiddenHalf = 768;
// Fused loop limits. Since the cuBLAS loop replays its steps from kept CUDA graphs (lstm.cu),
// its step costs device time only, and it overtook the fused loop at B·H = 65536 (the forward:
// B = 64, H = 1024 TF32 3.14 against 4.89 ms, bf16 2.51 against 2.81; B = 256, H = 256 TF32
// 2.34 against 2.88) and in the backward at B = 64, H = 1024 (bf16) and B·H = 16384 (TF32):
// H200 grid, 2026-11-25, docs/kernels.md. Before, the host-bound cuBLAS loop had lost those.
// Where the steps are not replayed (T < 16, a ragged PackedSequence with a projection) the cuBLAS
// loop is host-bound again and the fused loop would still win these shapes; the 16-bit rules look
// at a ragged sequence of T < 16 (kFusedMaxBackwardBHRaggedHalf, kFusedMaxForwardBHRaggedHalf), the
// rest do not.
constexpr int64_t kFusedMaxForwardBH = 32 * 1024;  // fused forward: B·H <= 32768 and ...
// ... H <= 1280 (16-bit) or 1024 (TF32), and the 16-bit fused backward H <= 1280 (backward op
// and forward calls under each loop, H200, 2026-11-26, docs/kernels.md: bf16 B = 8 / 16,
// H = 1280 `infer` 1.67 / 1.88 ms fused against 1.95 / 2.03 on cuBLAS, but H = 2048 3.73 / 4.10
// against 2.62 / 2.83; TF32 B = 16, H = 1280 4.31 against 3.40; bf16 backward B = 16 fused
// 2.99 against 3.18 at H = 1280, 3.67 against 3.30 at H = 1536, 5.46 against 3.72 at H = 1792,
// 4.57 against 3.76 once the slice stayed in L2 there).
// More unit blocks than SMs, or a W slice that leaves one block per SM, cost more there than
// the cuBLAS loop's GEMM.
constexpr int64_t kFusedMaxHiddenHalf = 1280;
// The 16-bit fused backward also at B <= 4 up to H = 1792: with the W slice in L2 beyond
// H ~ 1700 it wins there (backward op, H200, 2026-11-26, docs/benchmarks.md: bf16 B = 1,
// H = 1792 2.34 ms against 2.95 on cuBLAS, B = 4 2.80 against 3.03, B = 4, H = 1536 2.72
// against 2.80), not from B = 8 (H = 1536 2.85 against 2.71, H = 1792 3.35 against 2.97).
constexpr int64_t kFusedBackwardSmallBatchHalf = 4;
constexpr int64_t kFusedMaxBackwardHiddenSmallBatchHalf = 1792;
constexpr int64_t kFusedMaxForwardHiddenTf32 = 1024;
// The 16-bit fused backward stops at B = 32 since the cuBLAS loop's replayed gate kernels
// overlap its GEMMs (PDL): backward op, bf16 (H200, 2026-11-26, docs/benchmarks.md): B = 64,
// H = 256 2.23 ms fused against 2.03 on cuBLAS, H = 512 2.94 against 2.55; B = 32 still fused,
// H = 256 1.65 against 1.95, H = 512 2.05 against 2.40 (B = 64 had been fused up to B·H = 32768).
// And to B·H = 20480 since the cuBLAS loop's backward splits its dh GEMM along K (lstm.cu,
// step_k_parts): backward op, fused against cuBLAS with 4 parts (H200, 2026-11-26,
// docs/benchmarks.md), bf16 B = 32, H = 640 2.26 / 2.41, H = 768 2.56 / 2.47, H = 1024 3.18 /
// 2.70; B = 24, H = 768 2.49 / 2.49, H = 896 2.89 / 2.62; fp16 alike; B = 16, H = 1024 2.13 /
// 2.45.
constexpr int64_t kFusedMaxBackwardBatch = 32;  // fused backward, 16-bit: B <= 32 and ...
constexpr int64_t kFusedMaxBackwardBH = 20 * 1024;  // ... B·H <= 20480
constexpr int64_t kFusedMaxBackwardBHTf32 = 8 * 1024;  // fused backward, TF32: B·H <= 8192 and H <= 768
// A ragged packed sequence's cuBLAS steps were not replayed until the forty-fifth session, so there
// the cuBLAS loop was host-bound, and the 16-bit fused backward won to B·H = 98304 at any B. Packed
// fp16 training calls (lengths T down to T / 2), forward on auto and the backward on each loop, H200,
// 2026-11-29 (forty-fourth session, ms, fused / cuBLAS / persistent): B = 48 / 64, H = 768 11.29 /
// 16.55 / 16.64, 12.40 / 16.51 / 15.75; B = 48 / 64, H = 1024 11.08 / 15.64 / 15.51, 11.94 / 16.37 /
// 16.44; B = 96 / 128, H = 512 11.86 / 15.04 / 13.92, 10.74 / 14.33 / 13.55; B = 128, H = 768 12.03 /
// 15.71 / 15.55; but B = 128, H = 1024 13.60 / 12.52 / 12.38.
// Since the cuBLAS loop replays a ragged sequence's steps (from T = kReplaySteps), the padded
// rules hold there: the same calls, the backward on the replayed cuBLAS loop against the fused one
// (H200, forty-fifth session, ms, fused / cuBLAS): B = 48, H = 768 6.97 / 6.03; B = 64, H = 1024
// 7.97 / 6.67; B = 96 / 128, H = 512 7.11 / 6.43, 7.16 / 5.71; B = 128, H = 768 8.84 / 6.55; the
// forward (`infer`): B = 48, H = 768 2.61 / 2.78, B = 64, H = 1024 3.34 / 3.01, B = 96 / 128, H = 512
// 2.52 / 2.49, 2.51 / 2.39, B = 128, H = 768 3.64 / 2.87. So these two limits are for T <
// kReplaySteps only.
constexpr int64_t kFusedMaxBackwardBHRaggedHalf = 96 * 1024;
// And the 16-bit fused forward to B·H = 65536 there (fp16 `infer` calls under each loop, the same
// sequences, H200, 2026-11-29, ms, fused / unreplayed cuBLAS): B = 48 / 64, H = 768 2.33 / 3.64, 2.60
// / 3.67; B = 48 / 64, H = 1024 2.72 / 3.78, 3.01 / 3.64; B = 96 / 128, H = 512 2.47 / 3.56, 2.49 /
// 3.13; but B = 128, H = 768 3.42 / 3.26 and H = 1024 4.10 / 3.33.
constexpr int64_t kFusedMaxForwardBHRaggedHalf = 64 * 1024;

// The loop for one op call. `mma`: bf16, fp16, or float32 with TF32 allowed (float32 without it
// has rules of its own above, though its direct persistent forward and fused loop use tensor
// cores too); `half`: a 16-bit dtype; `cluster_forward`: the forward's cluster kernel applies
// (cluster_forward_applies); `row_split_backward`: the backward's row-split kernel applies;
// `one_cluster_wide`: above B = 16 the one-cluster kernel of this direction takes the call (lstm_one_cluster.cuh:
// the forward's for a 16-bit packed sequence, packed_one_cluster_forward, where its padded twin runs it
// in the cluster kernel's place; the backward's, one_cluster_backward_wide). A forced loop that does not
// apply to the call (e.g. persistent with a projection, fused in float64) leaves it to the cuBLAS loop.
//
// auto, from every loop forced side by side on an H200 (2026-11-24, T = 256, B in {1, 8, 16,
// 32, 64, 256}, H in {256, 512, 1024}, bf16 and TF32, scripts/lstm_backend_grid.py; the table
// is in docs/kernels.md):
//  - projection: cuBLAS (the only loop that has one);
//  - tensor-core dtypes: the persistent loop's step cost grows with the state it exchanges
//    between all blocks every step; the fused loop's is ~4 µs and nearly flat until the A
//    operand every block re-reads (B·H, or B·4H in the backward) grows; the cuBLAS loop's is
//    flat at its GEMM's device time (replayed from a kept CUDA graph), and it wins for large
//    B·H. Persistent (only at H <= 1024, kPersistentMaxHiddenMma) while the state is <= 8 KiB,
//    and in the forward also while B <= 16 with H <= 1024 (16-bit; the direct forward kernel,
//    re-measured 2026-11-24) or with the state <= 64 KiB (TF32; else only these), and in the
//    backward also (the split backward kernel, in thread-block clusters where they fit) for TF32
//    at B <= 4 and at B <= 16 (B <= 5 at H > 896) with H > 768 or H % 32 == 0 (H <= 1024), for
//    16-bit types at B <= 16 with B·H <= 8192, H <= 768 and H % 32 == 0, and where the row-split
//    backward kernel applies (16-bit, H = 1024, B <= 16, since 2026-11-28) or the one-cluster
//    backward kernel above B = 16 (16-bit, H = 256 to B = 64, H = 512 to B = 32, since 2026-11-29
//    (forty-third session), to B = 64 with its clusters in waves since the forty-fourth (or two
//    batch groups a cluster since the forty-sixth):
//    one_cluster_backward_wide, lstm_one_cluster.cuh); else fused while B·H <= 32768 with H <= 1280
//    (16-bit) or 1024 (TF32) (forward; the H200 grid of 2026-11-25; a 16-bit ragged packed sequence
//    of T < 16 to B·H = 65536 since 2026-11-29) or B <= 32 with B·H <= 32768 and H <= 1280 (a 16-bit
//    ragged packed sequence of T < 16: any B with B·H <= 98304, since 2026-11-29), or B <= 4 with
//    H <= 1792
//    (backward, 16-bit; TF32: B·H <= 8192 with H <= 768, and 5 < B <= 16 at 896 < H <= 1024, above,
//    but not from B = 8 where the cuBLAS loop's dh GEMM takes fp16 operands); else cuBLAS.
//    Since 2026-11-27 the 16-bit and the TF32 forward are also persistent wherever its cluster
//    kernel applies (`cluster_forward`, lstm_persistent.cuh's cluster_forward_applies:
//    16 < B <= 64, H in {256, 512, 1024} (TF32: {256, 512}, and 1024 up to B = 32 since the
//    eleventh session, up to B = 64 on scaled fp16 operands since the eighteenth), equal batch
//    sizes, sm_90 with >= 128 SMs): every loop forced on an H200
//    (`infer`, docs/benchmarks.md), bf16 B = 32 / 64, H = 256 0.92 / 1.08 ms against the fused
//    loop's 1.06 / 1.20; H = 512 1.01 / 1.33 against 1.18 / 1.57; H = 1024 1.38 / 2.20 against
//    1.91 fused and 2.12 / 2.26 on cuBLAS; TF32 H = 256 1.05 / 1.29 against 1.28 / 1.66, H = 512
//    1.09 / 1.64 against 1.58 / 2.18; TF32 H = 1024, B = 24 / 32, 1.89 / 1.97 against the fused
//    loop's 2.97 / 3.08.
//    The backward rules beyond the 8 KiB state are from training calls under each loop and
//    persistent kernel (scripts/lstm_backend_grid.py --mode train, H200, 2026-11-26,
//    docs/kernels.md): e.g. TF32 B = 16, H = 768: persistent (clustered split) 3.93 ms, fused
//    backward 4.90; bf16 B = 16, H = 512: 2.52 against 2.63, but H = 768: 3.33 against 2.70; the
//    TF32 rule at H > 896 from the backward op alone (scripts/lstm_backward_choice.py).
//  - float32 with TF32 off (the rules above, measured 2026-11-26): forward persistent at B <= 16,
//    and since 2026-11-27 wherever the cluster kernel's x3 instance applies (16 < B <= 64,
//    H in {256, 512}; H200, `infer`, TF32 off, B = 32 / 64: H = 256 1.25 / 1.61 ms against the
//    fused loop's 1.48 / 2.06, H = 512 1.50 / 2.58 against 2.08 / 3.20), fused at B > 16 with
//    H <= 512 and B·H <= 32768, else cuBLAS; backward persistent at B <= 8
//    with H <= 512, fused at 8 <= B <= 16 or (B >= 8 with) B·H <= 8192, else cuBLAS;
//  - float64 (no fused loop): persistent while the state is <= 64 KiB (forward) / 32 KiB
//    (backward), else cuBLAS (measured 2026-11-21, docs/kernels.md).
inline Loop choose_loop(const LstmSizes& s, int64_t elem_size, bool mma, bool half, bool backward,
                        bool cluster_forward = false, bool row_split_backward = false,
                        bool one_cluster_wide = false) {
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
  const int64_t state = s.B * s.H * elem_size, bh = s.B * s.H;
  if (!mma && elem_size == 4) {  // float32 without TF32
    if (backward) {
      if (s.B <= kPersistentMaxBackwardBatchFp32 && s.H <= kPersistentMaxBackwardHiddenFp32) return Loop::kPersistent;
      return s.B >= kFusedMinBackwardBatchFp32 && (s.B <= kFusedMaxBackwardBatchFp32 || bh <= kFusedMaxBackwardBHFp32)
                 ? Loop::kFused
                 : Loop::kCublas;
    }
    if (s.B <= kPersistentMaxForwardBatchMma || cluster_forward) return Loop::kPersistent;
    return s.H <= kFusedMaxForwardHiddenFp32 && bh <= kFusedMaxForwardBH ? Loop::kFused : Loop::kCublas;
  }
  if (!mma) {
    return state <= (backward ? kPersistentMaxBackwardState : kPersistentMaxForwardState) ? Loop::kPersistent
                                                                                            : Loop::kCublas;
  }
  bool persistent = false;
  if (s.H > kPersistentMaxHiddenMma) {
    // Beyond the tensor-core kernels' limit: not the persistent loop (it would fall back).
  } else if (backward) {
    const bool clusters = s.H % kClusterHiddenMultiple == 0;
    persistent = state <= kPersistentMaxStateMma || row_split_backward || one_cluster_wide ||
                 (half ? clusters && s.B <= kPersistentMaxBackwardBatchHalf && bh <= kPersistentMaxBackwardBHHalf &&
                             s.H <= kPersistentMaxBackwardHiddenHalf
                       : s.H <= kSplitBackwardMaxHidden &&
                             (s.B <= kPersistentBackwardSmallBatchTf32 ||
                              (s.B <= (s.H > kFusedBackwardWideHiddenTf32 ? kPersistentMaxBackwardBatchTf32Wide
                                                                          : kPersistentMaxBackwardBatchTf32) &&
                               (s.H > kFusedMaxBackwardHiddenTf32 || clusters))));
  } else if (half) {
    persistent = (s.B <= kPersistentMaxForwardBatchMma && s.H <= kPersistentMaxForwardHiddenHalf) ||
                 state <= kPersistentMaxStateMma || cluster_forward || one_cluster_wide;
  } else {
    persistent = (s.B <= kPersistentMaxForwardBatchMma && state <= kPersistentMaxForwardState) || cluster_forward;
  }
  if (persistent) return Loop::kPersistent;
  bool fused;
  // A ragged sequence whose cuBLAS steps are not replayed (lstm.cu's cublas_replay_applies: from
  // kReplaySteps steps without a projection, which never reaches here).
  const bool ragged = !all_steps_full(s) && s.T < kReplaySteps;
  if (backward) {
    fused = half ? ((s.B <= kFusedMaxBackwardBatch && bh <= kFusedMaxBackwardBH) ||
                    (ragged && bh <= kFusedMaxBackwardBHRaggedHalf)) &&
                       (s.H <= kFusedMaxHiddenHalf ||
                        (s.B <= kFusedBackwardSmallBatchHalf && s.H <= kFusedMaxBackwardHiddenSmallBatchHalf))
                 : (bh <= kFusedMaxBackwardBHTf32 && s.H <= kFusedMaxBackwardHiddenTf32) ||
                       (s.H > kFusedBackwardWideHiddenTf32 && s.H <= kSplitBackwardMaxHidden &&
                        s.B <= kPersistentMaxBackwardBatchTf32 &&
                        !(s.B >= kCublasMinBackwardBatchTf32Wide && half_dh_units_fit(s.H, kHalfDhParts)));
  } else {
    fused = (bh <= kFusedMaxForwardBH || (half && ragged && bh <= kFusedMaxForwardBHRaggedHalf)) &&
            s.H <= (half ? kFusedMaxHiddenHalf : kFusedMaxForwardHiddenTf32);
  }
  return fused ? Loop::kFused : Loop::kCublas;
}

// Drops every thread's kept chunk graphs of the replayed loops (the cuBLAS and fused loops,
// replayed_steps.cuh), with their buffers, on every device (lstm.cu); seqkernels.release_step_graphs()
// calls it.
void release_lstm_step_graphs();

}  // namespace cuda
}  // namespace seqkernels
