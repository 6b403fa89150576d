// The one-cluster forward kernel of the persistent LSTM loop (sm_90): a whole layer's time loop
// in one thread-block cluster of H / 32 blocks per 8 batch rows, h exchanged in distributed shared
// memory.
// lstm_persistent.cu's run_forward calls it first for bf16 / fp16 (unless the cluster kernel is
// forced); it returns false, having launched nothing, where it does not apply or its clusters
// cannot all be resident (and the cluster or the direct kernel takes the call). Design notes: the
// top of lstm_one_cluster.cu and docs/kernels.md.
//
// Shape legend: T steps, N = sum(batch_sizes) packed rows (T·B where every step is full), B =
// batch_sizes[0], H hidden, G = 4H gate rows (i, f, g, o).
#pragma once

#include <cstdint>

#include "seqkernels/lstm_checks.h"

namespace seqkernels {
namespace cuda {

// Whether the kernel can run a call of these sizes: bf16 / fp16 (the caller's), 1 <= B <=
// kOneClusterMaxRows (ceil(B / 8) clusters, one per 8 batch rows, which the launch also needs
// resident at once: else it launches nothing), H in {128, 256, 512}, no projection, every step
// full or a packed sequence of at most kMaxSegments distinct batch sizes (packed_steps.cuh), on
// sm_90 or later.
constexpr int64_t kOneClusterMaxRows = 64;
bool one_cluster_forward_fits(const LstmSizes& s, int sm_major);

// Where it takes the call: wherever it fits. Faster than the kernels it replaced at every B it
// was measured at (H200, bf16 `infer` CUDA-graph replays, T = 256, ms, one-cluster / before: B = 12
// and 16 0.258 / 0.398-0.411 at H = 256, 0.366-0.373 / 0.506-0.593 at H = 512, against the direct
// kernel; B = 32 and 64 0.268-0.294 / 0.725-0.903 at H = 256, B = 32 0.399-0.405 / 0.809-0.821 at
// H = 512, against the cluster kernel; docs/kernels.md). At H = 512, B = 57-64 its 8 clusters of 16
// blocks are more than an H200 holds at once (7): 4 clusters run two batch groups each (paired_groups;
// a packed sequence: in waves, one_cluster_waves).
// SEQKERNELS_LSTM_ONE_CLUSTER (diagnostic): "0" never.
bool one_cluster_forward_applies(const LstmSizes& s, int sm_major);

// The sizes above B = 16 at which lstm_loop.cuh's rule takes the persistent loop for these kernels
// (16-bit types, the caller's): H = 256 up to B = 64 (8 clusters of 8 blocks) and H = 512 up to
// B = kOneClusterWideMaxBatch512 (4 clusters of 16 blocks), and beyond it up to B = 64 where the
// clusters may run in waves (one_cluster_waves).
constexpr int64_t kOneClusterWideMaxBatch512 = 32;
// Where the launch needs only one resident cluster, not all, so the batch groups may run in more than
// one wave: H = 512 above kOneClusterWideMaxBatch512, up to kOneClusterMaxRows. The clusters never wait
// for each other, so a later wave only waits for the SMs that the first one frees; an H200 holds 7
// clusters of 16 blocks, so B = 57-64 runs in two (twice the loop of B = 56) where paired_groups does
// not take it (packed sequences, or SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS=0). H200, fp16 / bf16,
// T = 256 (2026-11-29, forty-fourth session, ms, waves / SEQKERNELS_LSTM_ONE_CLUSTER_WAVES=0, whose
// backward ran the cuBLAS loop and B = 64's forward the cluster kernel): `train` B = 40 1.406 / 2.765
// and 1.459 / 2.691, B = 48 1.476 / 2.802 and 1.458 / 2.827, B = 64 2.482 / 3.458 and 2.487 / 3.469;
// `infer` B = 64 0.982 / 1.254 and 0.997 / 1.277; packed fp16 `train` B = 48 / 64 1.711 / 7.473,
// 1.991 / 7.103. SEQKERNELS_LSTM_ONE_CLUSTER_WAVES (diagnostic): "0" never.
bool one_cluster_waves(const LstmSizes& s);
// Where the forward may run two batch groups in each cluster (16 rows, one step of each group in turn, so
// one group's exchange is in flight while the other computes) when one group a cluster cannot have all
// its clusters resident at once: H = 512 above kOneClusterWideMaxBatch512, equal batch sizes. On an H200,
// B = 57-64 then runs 4 clusters in one wave instead of 7 and then 1: H200, T = 256, bench_lstm.py in
// one run, ms, paired / SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS=0: fp16 B = 64 `infer` 0.674 / 0.946, `train`
// 2.122 / 2.434; bf16 0.650 / 0.861, 2.137 / 2.431; B = 57 fp16 0.694 / 0.935, 2.115 / 2.268.
// SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS (diagnostic): "0" never (the waves above); "1" at H = 512 from B = 1,
// before one group a cluster (paired_groups_first: tests and A/Bs).
bool paired_groups(const LstmSizes& s);
bool paired_groups_first();
inline bool one_cluster_wide_sizes(const LstmSizes& s) {
  return s.B > 16 && (s.H == 256 || (s.H == 512 && (s.B <= kOneClusterWideMaxBatch512 || one_cluster_waves(s))));
}
// A packed sequence (batch sizes that shrink) at those sizes takes the persistent forward loop, where
// its padded twin would run this kernel (the cluster kernel, which the rule looks at there, takes equal
// batch sizes only).
bool packed_one_cluster_forward(const LstmSizes& s, int sm_major);
// The backward at those sizes (padded or packed) takes the persistent loop for the one-cluster backward
// kernel: before, the fused or cuBLAS loop. Training calls, H200, fp16, T = 256 (2026-11-29, forty-third
// session, ms, that rule / the persistent loop forced): B = 32 / 64, H = 256 1.937 / 1.100, 2.529 /
// 1.284; B = 32, H = 512 2.427 / 1.351 (B = 64, H = 512: 3.465 / 8.254 before its clusters ran in waves);
// packed (lengths T down to T / 2), whose steps the other loops do not replay: B = 32 / 64, H = 256
// 2.658 / 1.234, 4.756 / 1.352; B = 32, H = 512 2.854 / 1.612.
bool one_cluster_backward_wide(const LstmSizes& s, int sm_major);

// Forward of one layer and direction after the input projection, with lstm_persistent_forward's
// contract (lstm_persistent.cuh): pre [N, G] float (no bias); b_ih, b_hh [G] or nullptr; w_hh [G, H];
// h0, c0 [B, H]; writes y [N, H], gates [N, G] / cells [N, H] (training, else nullptr), h_n [B, H]
// and c_n [B, H] float. trace: SEQKERNELS_LSTM_TRACE (the caller's reading of it). False, having
// launched nothing, where it does not apply or its cluster cannot be resident.
template <class scalar_t>
bool lstm_one_cluster_forward(const LstmSizes& s, bool reverse, bool training, bool trace, const float* pre,
                              const scalar_t* b_ih, const scalar_t* b_hh, const scalar_t* w_hh, const scalar_t* h0,
                              const scalar_t* c0, scalar_t* y, scalar_t* gates, scalar_t* cells, scalar_t* h_n,
                              float* c_n);

// The backward of the same clusters (one per 8 batch rows; each block holds W_hh's 128 rows of its
// units' gates and multiplies its own dG by them, the partial sums of dh exchanged in distributed
// shared memory), where the forward kernel fits and
// SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD (diagnostic) is not "0"; lstm_persistent_backward.cu's
// run_backward calls it first for bf16 / fp16.
bool one_cluster_backward_applies(const LstmSizes& s, int sm_major);

// Backward of one layer and direction with lstm_persistent_backward's contract (lstm_persistent.cuh):
// w_hh [G, H]; gates [N, G] and cells [N, H] as the forward saved them; y, grad_y [N, H]; h0, c0,
// grad_h_n, grad_c_n [B, H]; writes dG [N, G], hprev [N, H] (h_{t-1} of every row), grad_h0 and
// grad_c0 [B, H] float. False, having launched nothing, where it does not apply or its clusters
// cannot all be resident.
template <class scalar_t>
bool lstm_one_cluster_backward(const LstmSizes& s, bool reverse, bool trace, const scalar_t* w_hh,
                               const scalar_t* gates, const scalar_t* cells, const scalar_t* y, const scalar_t* grad_y,
                               const scalar_t* h0, const scalar_t* c0, const scalar_t* grad_h_n,
                               const scalar_t* grad_c_n, scalar_t* dG, scalar_t* hprev, float* grad_h0,
                               float* grad_c0);

}  // namespace cuda
}  // namespace seqkernels
