// The persistent small-batch LSTM path on the GPU: one cooperative kernel runs a layer's
// whole time loop (forward) or its whole reverse-time loop (backward), with the recurrent
// weights resident on chip. csrc/cuda/lstm.cu calls these after its input projection when
// it has chosen this loop (lstm_loop.cuh); each returns false, having done nothing, when the
// persistent path does not apply (projection, batch or hidden size beyond its limits, not
// enough co-resident blocks), and lstm.cu then runs its cuBLAS loop. Design notes and limits:
// docs/kernels.md and the top of lstm_persistent.cu.
//
// Shape legend: T steps, N = sum(batch_sizes) packed rows, B = batch_sizes[0], H hidden,
// G = 4H gate rows (i, f, g, o). acc_t = at::opmath_type<scalar_t> (float for half types).
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "seqkernels/lstm_checks.h"

namespace seqkernels {
namespace cuda {

// The split backward kernel's hidden-size limit (8 warps x 16 n8 tiles of resident fragments);
// lstm_loop.cuh's TF32 backward rule relies on it.
constexpr int64_t kSplitBackwardMaxHidden = 1024;
// The tensor-core kernels' hidden-size limit (their resident MMA fragments cover H <= 1024);
// beyond it they leave the call to the cuBLAS loop, so lstm_loop.cuh does not choose them there.
constexpr int64_t kPersistentMaxHiddenMma = 1024;

// The operands of the forward cluster kernel's products (its last template argument,
// lstm_persistent_cluster.cu).
enum class ClusterOperands {
  kSixteenBit,  // bf16 / fp16
  kTf32,        // float32 with TF32 allowed, TF32 operands
  kHalfScaled,  // float32 with TF32 allowed, fp16 operands scaled by powers of two (TF32's mantissa)
  kTf32x3,      // float32 with TF32 off: three TF32 products on split operands
};

// A diagnostic switch that is on unless the variable `name` is "0".
inline bool switch_on(const char* name) {
  const char* env = std::getenv(name);
  return env == nullptr || std::strcmp(env, "0") != 0;
}

// The diagnostic switches with three settings: -1 unset or empty (the heuristic), 0 for "0"
// (never), else 1 (wherever the path can run).
inline int diagnostic_mode(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || env[0] == '\0') return -1;
  return std::strcmp(env, "0") == 0 ? 0 : 1;
}

// Whether float32 with TF32 allowed takes scaled fp16 operands in the cluster forward kernel.
// SEQKERNELS_LSTM_CLUSTER_HALF (diagnostic): "0" never (TF32 operands; then H = 1024 only up to
// B = 32); unset or anything else, always: they were faster at every shape measured (H200, below).
inline bool cluster_half_products() { return switch_on("SEQKERNELS_LSTM_CLUSTER_HALF"); }
// Whether float32 with TF32 allowed takes scaled fp16 operands in the direct forward kernel
// (Path::kHalfScaled); SEQKERNELS_LSTM_DIRECT_HALF=0 (diagnostic) keeps TF32 operands there.
inline bool direct_half_products() { return switch_on("SEQKERNELS_LSTM_DIRECT_HALF"); }
// Whether float32 with TF32 off multiplies on fp16 parts in the direct forward kernel at B <= 8 and
// Hp > 512 (Path::kHalfX3: W_hh's parts in half the bytes of TF32 parts, 64 KB read from shared
// memory a step instead of 160, and half as many MMAs). One build on an H200 (2026-11-28, `infer`,
// T = 256, CUDA-graph replays, ms, TF32 parts / fp16 parts): H = 1024 B = 1 / 4 / 8 0.761-0.765 /
// 0.677-0.688, 1.043-1.044 / 0.905-0.918, 1.187-1.188 / 1.075-1.092 (`train` eager calls B = 1 / 8
// 3.54-3.55 / 3.42-3.46, 5.85-5.90 / 5.72-5.78); at H = 512 and 256, where TF32 parts keep W_hh in
// registers, fp16 parts were slower (B = 1 0.431-0.433 / 0.482-0.489, 0.358-0.363 / 0.411-0.426),
// so the kernel takes them at 8 k-steps per warp only. SEQKERNELS_LSTM_DIRECT_X3_HALF=0
// (diagnostic) keeps TF32 parts (Path::kTf32x3) there too.
inline bool direct_x3_half_products() { return switch_on("SEQKERNELS_LSTM_DIRECT_X3_HALF"); }

// Whether the cluster forward kernel's 16-bit-operand instances at H = 1024 in one m16 tile (B <= 16)
// multiply all of K in each block (kWholeK: every block reads all of h_{t-1}, twice the bytes, and
// no partial sums cross between the pair) instead of a K half each: up to kClusterWholeKMaxBatch.
// One build on an H200 (2026-11-28, `infer`, T = 256, CUDA-graph replays, ms, K halves / whole K):
// bf16 B = 6 / 8 / 12 / 16 0.650-0.657 / 0.574, 0.662-0.668 / 0.603-0.605, 0.678-0.679 /
// 0.687-0.699, 0.701-0.709 / 0.714-0.715; float32 with TF32 (scaled fp16 operands) B = 8 / 16
// 0.691-0.702 / 0.668-0.671, 0.758-0.766 / 0.775-0.776. Trace, bf16 B = 8 (cycles a step): the
// exchange 1096 -> 73, the wait and gather 1660 -> 2425; at B = 16 the gather grows by 1114.
// SEQKERNELS_LSTM_CLUSTER_WHOLE_K (diagnostic): "0" never, set otherwise at any B <= 16.
constexpr int64_t kClusterWholeKMaxBatch = 8;
inline bool cluster_whole_k(int64_t batch) {
  const int mode = diagnostic_mode("SEQKERNELS_LSTM_CLUSTER_WHOLE_K");
  return mode == 1 || (mode == -1 && batch <= kClusterWholeKMaxBatch);
}

// Whether the cluster forward kernel's calls at H = 1024, B <= 16 on 16-bit operands (16-bit types;
// float32 with TF32 on scaled fp16 operands) run the row-split kernel instead
// (lstm_persistent_cluster.cu: the pair splits the batch rows, each block all of K and all of the
// cluster's units, nothing exchanged between the pair, each warp gathering its own K eighth); at
// B = 1 it also takes the call from the direct kernel (cluster_forward_applies).
// One build on an H200 (2026-11-28, `infer`, T = 256, CUDA-graph replays, ms, this rule's kernel
// against the last one's: B = 1 the direct kernel, B = 2 / 3 the whole-K cluster kernel, B >= 4 the
// row split with the whole tile gathered before a block barrier): bf16 B = 1 / 2 / 3 / 4 0.446-0.458
// / 0.492-0.493, 0.437-0.443 / 0.527-0.528, 0.455-0.466 / 0.518, 0.448-0.467 / 0.532; B = 8 / 12 /
// 16 0.525-0.530 / 0.575-0.579, 0.552-0.555 / 0.601-0.607, 0.579-0.583 / 0.629-0.635; fp16 the same
// to within 0.01 ms; `train` eager calls B = 4 / 8 / 16 1-2 % faster (docs/benchmarks.md).
// float32 with TF32 on scaled fp16 operands takes it too (thirty-fifth session, 2026-11-28, one
// build, the same method, the last rule / the row split): B = 2 / 3 / 4 / 8 / 16 0.564-0.566 /
// 0.521-0.523, 0.572-0.578 / 0.541-0.542, 0.596-0.605 / 0.535-0.549, 0.681-0.684 / 0.628-0.638,
// 0.759-0.761 / 0.703-0.710; at B = 1 the direct kernel was faster (0.506-0.508 / 0.525-0.526)
// until W_hh's scan read float4s with 16 loads in flight (thirty-sixth session, 2026-11-28, one
// build, direct / row split: 0.497-0.517 / 0.472-0.474).
// SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT (diagnostic): "0" never, at any B (the direct kernel at B = 1, the
// cluster kernel from B = 2: whole K to B = 8, K halves above); unset or anything else, always.
inline bool cluster_row_split() { return diagnostic_mode("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT") != 0; }
// Whether the row split also takes the calls at 16 < B <= 64 (2 / 4 n8 tiles of rows a block to
// B = 32 / 64: no partial sums between the pair, where the cluster kernel exchanges them). One build
// on an H200 (2026-11-28, T = 256, ms, cluster kernel / wide row split; `infer` CUDA-graph replays):
// bf16 B = 17 / 24 / 32 / 48 / 64 0.952-0.954 / 0.836-0.842, 1.022-1.024 / 0.880-0.884,
// 1.080-1.090 / 0.927-0.939, 1.865-1.869 / 1.314-1.330, 2.077 / 1.434-1.443; fp16 within 0.01 ms of
// those; `train` eager calls bf16 B = 32 / 64 3.51-3.55 / 3.37-3.42, 4.97-5.01 / 4.34-4.38; float32
// with TF32 (scaled fp16 operands, thirty-fifth session) B = 24 / 48 / 64 1.081-1.085 / 0.952-0.961,
// 1.930-1.938 / 1.430-1.439, 2.221-2.231 / 1.552-1.562.
// SEQKERNELS_LSTM_ROW_SPLIT_WIDE (diagnostic): "0" never (the cluster kernel above B = 16); unset
// or anything else, always.
inline bool row_split_wide() { return diagnostic_mode("SEQKERNELS_LSTM_ROW_SPLIT_WIDE") != 0; }

// The operands a call of dtype size elem_size would take (tf32: float32 may use TF32).
inline ClusterOperands cluster_operands(int64_t elem_size, bool tf32) {
  if (elem_size != 4) return ClusterOperands::kSixteenBit;
  if (!tf32) return ClusterOperands::kTf32x3;
  return cluster_half_products() ? ClusterOperands::kHalfScaled : ClusterOperands::kTf32;
}

// Whether the op's own W_hh and h0 suit the cluster kernels on scaled fp16 operands (kHalfScaled):
// both 16-byte aligned, for W_hh's scan (warp_rows_abs_max) and h0's float4 rows.
// run_cluster_forward declines a call without it; lstm.cu asks first, to skip the scaled projection.
inline bool half_scaled_inputs_aligned(const void* w_hh, const void* h0) {
  return reinterpret_cast<std::uintptr_t>(w_hh) % 16 == 0 && reinterpret_cast<std::uintptr_t>(h0) % 16 == 0;
}

// The forward's cluster kernel (lstm_persistent_cluster.cu: 64 clusters of two blocks, one block
// per SM) runs B <= 64 at H in {256, 512, 1024} on 16-bit operands (16-bit types, and float32 with
// TF32 on scaled fp16 operands) and H in {256, 512} for float32 on TF32 operands or without TF32
// (three TF32 MMAs per product), and float32 on TF32 operands at H = 1024 up to B = 32, with equal
// batch sizes at every step (no ragged PackedSequence), no projection, on a GPU with thread-block
// clusters (sm_90) and at least kClusterForwardBlocks SMs.
constexpr int kClusterForwardBlocks = 128;
inline bool cluster_forward_fits(const LstmSizes& s, int sm_major, int sm_count, ClusterOperands ops) {
  const bool sixteen = ops == ClusterOperands::kSixteenBit || ops == ClusterOperands::kHalfScaled;
  const bool tf32_1024 = ops == ClusterOperands::kTf32 && s.B <= 32;  // TF32 operands: 2 m16 tiles at most
  const bool hidden = s.H == 256 || s.H == 512 || (s.H == 1024 && (sixteen || tf32_1024));
  return sm_major >= 9 && sm_count >= kClusterForwardBlocks && s.P == 0 && s.B >= 1 && s.B <= 64 && hidden &&
         all_steps_full(s);
}
// Where it takes the call: wherever it fits at B > 16 (lstm_loop.cuh's rule chooses the persistent
// loop there), and at B <= 16, where the direct kernel runs otherwise, at H = 1024 in one m16 tile:
// on 16-bit operands (16-bit types; float32 with TF32 on scaled fp16 operands) from
// kClusterForwardMinBatchOneTile, on TF32 operands from kClusterForwardMinBatchOneTileTf32. Both
// kernels forced on an H200 (2026-11-27, the cluster kernel with poisoned h; `infer`, T = 256,
// CUDA-graph replays, ms, direct / cluster; docs/benchmarks.md):
// bf16 B = 4 / 6 / 8 / 10 / 16 0.658 / 0.711, 0.813 / 0.740, 0.818 / 0.769, 0.918 / 0.793,
// 1.010 / 0.843 (fp16 alike; `train` B = 8 3.11 / 3.01); TF32 B = 6 / 8 / 9 / 12 / 16 0.830 / 0.904,
// 0.962 / 0.945, 1.046 / 0.961, 1.140 / 0.985, 1.194 / 1.077 (eager calls at B = 8 1.25 / 1.19,
// `train` 3.95 / 3.86). At H <= 512 and in float32 without TF32 the direct kernel stays faster
// (bf16 B = 8 / 16, H = 512: 0.468 / 0.610, 0.581 / 0.640). TF32 at H = 1024, B = 24 / 32: 1.89 /
// 1.97 ms against `auto`'s 2.97 / 3.08 before it took the cluster kernel there (the fused loop).
// TF32 on scaled fp16 operands (2026-11-27, eighteenth session, the same method): B = 2 / 4 / 6 / 8
// 0.66 / 0.73, 0.77 / 0.75, 0.87 / 0.78, 0.90 / 0.80 (direct / cluster); the scaled fp16 operands
// against TF32 operands in the cluster kernel, B = 8 / 16 / 32, H = 1024 0.80 / 0.94, 0.90 / 1.05,
// 1.35 / 1.60; B = 64, H = 1024 2.28 against the cuBLAS loop's 2.96 (no TF32-operand instance), and
// 3-19 % less at B = 17-64, H = 256 / 512 (docs/benchmarks.md).
// With the whole-K instances (cluster_whole_k, above) the cluster kernel wins from B = 2 (2026-11-28,
// one build, the same method, direct / cluster whole K forced): bf16 B = 1 / 2 / 3 / 4 / 5
// 0.487-0.497 / 0.505-0.512, 0.526-0.528 / 0.521-0.528 (a tie), 0.598-0.599 / 0.518-0.522,
// 0.805-0.830 / 0.560-0.567, 0.698-0.702 / 0.572-0.575; float32 with TF32 0.500 / 0.530-0.539,
// 0.634-0.638 / 0.574, 0.654-0.655 / 0.598-0.602, 0.724-0.730 / 0.615-0.620, 0.781-0.785 /
// 0.631-0.634 (fp16 not measured: the bf16 instances' code on fp16 operands).
constexpr int64_t kClusterForwardMinBatchOneTile = 2;
constexpr int64_t kClusterForwardMinBatchOneTileTf32 = 8;
inline bool cluster_forward_applies(const LstmSizes& s, int sm_major, int sm_count, ClusterOperands ops) {
  // (cluster_forward_fits has no float32 H = 1024 instance without TF32.) At B = 1 the row-split
  // kernel takes the calls on 16-bit operands (cluster_row_split, above).
  int64_t one_tile_min_batch = kClusterForwardMinBatchOneTile;
  if (ops == ClusterOperands::kTf32) one_tile_min_batch = kClusterForwardMinBatchOneTileTf32;
  const bool sixteen = ops == ClusterOperands::kSixteenBit || ops == ClusterOperands::kHalfScaled;
  if (sixteen && cluster_row_split()) one_tile_min_batch = 1;
  return cluster_forward_fits(s, sm_major, sm_count, ops) && (s.B > 16 || (s.H == 1024 && s.B >= one_tile_min_batch));
}

// The persistent backward's row-split kernel (lstm_row_split_backward.cu): 16-bit types at H = 1024,
// 1 <= B <= kRowSplitBackwardMaxBatch, equal batch sizes at every step, no projection, on sm_90 with
// at least kClusterForwardBlocks SMs (its 128 blocks, one per SM). lstm.cu asks it before choosing the
// backward's loop (choose_loop's `row_split_backward`), run_backward before launching.
// SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD (diagnostic): "0" never (auto's rule without it; a forced
// persistent loop then runs the split or general backward kernel).
constexpr int64_t kRowSplitBackwardHidden = 1024;
constexpr int64_t kRowSplitBackwardMaxBatch = 16;
inline bool row_split_backward_applies(const LstmSizes& s, int64_t elem_size, int sm_major, int sm_count) {
  return switch_on("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD") && elem_size == 2 && sm_major >= 9 &&
         sm_count >= kClusterForwardBlocks && s.P == 0 && s.H == kRowSplitBackwardHidden && s.B >= 1 &&
         s.B <= kRowSplitBackwardMaxBatch && all_steps_full(s);
}

// Whether the cluster forward kernels (and the row split) poll the poisoned words of h_{t-1}
// themselves instead of waiting for the producers' step flags first: one L2 round trip and one
// block barrier fewer a step, but every thread's words re-read while poisoned, which costs more
// than it saves once a block gathers more than kClusterPollDataMaxBytes of h_{t-1} a step (its rows
// of its K range; the caller passes the bytes). `infer` replays on an H200 (ms, flags / polled):
// bf16 H = 1024 B = 8 0.750-0.752 / 0.652-0.654, B = 16 0.812-0.818 / 0.702-0.707 (2026-11-28,
// 16 KB); then (2026-11-28, thirty-second session) B = 17 / 24 / 32 1.067-1.069 / 0.953-0.968,
// 1.137-1.149 / 1.020-1.034, 1.191-1.205 / 1.072-1.089 (17-32 KB), B = 48 / 64 1.863 / 3.99-4.08,
// 2.064-2.079 / 4.537-4.542 (48 / 64 KB); float32 with TF32 (scaled fp16 operands) H = 256 B = 24 /
// 64 0.680-0.682 / 0.585-0.594, 0.933-0.937 / 0.802-0.806 (6 / 16 KB), H = 512 B = 17 / 32 / 48 /
// 64 0.758-0.761 / 0.640-0.642, 0.828-0.829 / 0.698-0.700, 1.142-1.144 / 1.007-1.013,
// 1.195 / 1.087-1.098 (up to 32 KB), H = 1024 B = 17 / 32 / 48 1.144-1.145 / 1.036, 1.277-1.279 /
// 1.148-1.151 (up to 32 KB), 1.933-1.942 / 4.449-4.466 (48 KB); without TF32 (float operands)
// H = 256 B = 24 / 64 0.911-0.920 / 0.759-0.763, 1.325-1.327 / 1.195-1.197 (12 / 32 KB), H = 512
// B = 24 / 64 1.289-1.297 / 1.200-1.203 (24 KB), 2.342-2.344 / 4.708-4.716 (64 KB).
// The row-split backward gathers dG (its ceil(B / 2) rows of 4H values, up to 64 KB at B = 16) and
// polls at every B it runs (max_bytes = kRowSplitBackwardPollDataMaxBytes): backward op alone,
// H200, bf16 / fp16 H = 1024, ms, flags / polled, three runs in two sessions (2026-11-28), B = 12
// 1.649 / 1.533, 1.620 / 1.545, 1.553 / 1.401 (bf16), 1.599 / 1.541, 1.563 / 1.457 (fp16); B = 16
// 1.562 / 1.513, 1.767 / 1.708, 1.723 / 1.629 (bf16), 1.801 / 1.722, 1.715 / 1.652 (fp16).
// SEQKERNELS_LSTM_CLUSTER_POLL_DATA (diagnostic): "0" never, anything else always; unset, this rule.
constexpr int64_t kClusterPollDataMaxBytes = 32 * 1024;
constexpr int64_t kRowSplitBackwardPollDataMaxBytes = 64 * 1024;
inline bool cluster_polls_data(int64_t gathered_bytes, int64_t max_bytes = kClusterPollDataMaxBytes) {
  const int mode = diagnostic_mode("SEQKERNELS_LSTM_CLUSTER_POLL_DATA");
  return mode == -1 ? gathered_bytes <= max_bytes : mode == 1;
}

// Forward of one layer and direction, after the input projection. Writes y, the saved
// gates/cells (training), h_n and c_n exactly as the cuBLAS loop of lstm.cu does.
//   pre   [N, G] acc_t   x·W_ihᵀ of every packed row (bias not added)
//   pre_unscale [N + G]  nullptr, or (float32 with TF32) pre as lstm.cu's scaled fp16 projection
//                        left it: element (n, g) times pre_unscale[n], then pre_unscale[N + g].
//                        Only the cluster kernel on scaled fp16 operands takes it: false otherwise.
//   b_ih, b_hh [G]       the biases, or nullptr (no bias): the kernels add b_ih + b_hh in acc_t
//   w_hh  [G, H]; h0, c0 [B, H]  (the op's inputs: only read)
//   y [N, H]; gates [N, G] and cells [N, H] (training only, else nullptr)
//   h_n [B, H]; c_n [B, H] acc_t
//   tf32: float32 may use TF32 tensor cores (cuda::rnn_allows_tf32()); ignored for other dtypes
//   like: any tensor on the device (workspace allocation)
template <class scalar_t>
bool lstm_persistent_forward(const LstmSizes& s, bool reverse, bool training, bool tf32,
                             const at::opmath_type<scalar_t>* pre, const float* pre_unscale, const scalar_t* b_ih,
                             const scalar_t* b_hh, const scalar_t* w_hh, const scalar_t* h0, const scalar_t* c0,
                             scalar_t* y, scalar_t* gates, scalar_t* cells, scalar_t* h_n,
                             at::opmath_type<scalar_t>* c_n, const at::Tensor& like);

// Backward time loop of one layer and direction (no projection). Produces what the cuBLAS
// loop of lstm.cu produces before its whole-sequence GEMMs:
//   dG [N, G]     pre-activation gradients of every row (the GEMMs' input)
//   hprev [N, H]  h_{t-1} of every row (h0 for a sequence's first step)
//   grad_h0, grad_c0 [B, H] acc_t
// from the saved forward tensors (gates [N, G], cells [N, H], y [N, H]), grad_y [N, H],
// h0/c0 [B, H] and grad_h_n/grad_c_n [B, H].
template <class scalar_t>
bool lstm_persistent_backward(const LstmSizes& s, bool reverse, bool tf32, const scalar_t* w_hh,
                              const scalar_t* gates, const scalar_t* cells, const scalar_t* y,
                              const scalar_t* grad_y, const scalar_t* h0, const scalar_t* c0,
                              const scalar_t* grad_h_n, const scalar_t* grad_c_n, scalar_t* dG, scalar_t* hprev,
                              at::opmath_type<scalar_t>* grad_h0, at::opmath_type<scalar_t>* grad_c0,
                              const at::Tensor& like);

}  // namespace cuda
}  // namespace seqkernels
