// The fused-step LSTM loop on the GPU: one kernel per time step computes the step's recurrent
// product on tensor cores and applies the gate math in its epilogue, and consecutive steps
// overlap through programmatic dependent launch. csrc/cuda/lstm.cu calls these after its
// input projection when it has chosen this loop (lstm_loop.cuh); each returns false, having
// done nothing, when the fused-step loop does not apply (projection, a dtype/precision without
// tensor cores, a hidden size or alignment it cannot take, shared memory), and lstm.cu then
// runs its cuBLAS loop. Design notes: the top of lstm_fused_step.cu and docs/kernels.md.
//
// Shape legend: T steps, N = sum(batch_sizes) packed rows, B = batch_sizes[0], H hidden,
// G = 4H gate rows (i, f, g, o). acc_t = at::opmath_type<scalar_t> (float for half types).
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>

#include "seqkernels/lstm_checks.h"

namespace seqkernels {
namespace cuda {

// Forward of one layer and direction, after the input projection. Same contract as
// lstm_persistent_forward (lstm_persistent.cuh): writes y, the saved gates/cells (training),
// h_n and c_n exactly as the cuBLAS loop of lstm.cu does.
//   pre [N, G] acc_t (x·W_ihᵀ, bias not added); b_ih, b_hh [G] or nullptr (added in-kernel); w_hh [G, H];
//   h0, c0 [B, H]; y [N, H]; gates [N, G] / cells [N, H] (training, else nullptr);
//   h_n [B, H]; c_n [B, H] acc_t; tf32: float32 may use TF32 (cuda::rnn_allows_tf32())
template <class scalar_t>
bool lstm_fused_forward(const LstmSizes& s, bool reverse, bool training, bool tf32,
                        const at::opmath_type<scalar_t>* pre, const scalar_t* b_ih, const scalar_t* b_hh,
                        const scalar_t* w_hh, const scalar_t* h0, const scalar_t* c0, scalar_t* y, scalar_t* gates,
                        scalar_t* cells, scalar_t* h_n, at::opmath_type<scalar_t>* c_n, const at::Tensor& like);

// Backward time loop of one layer and direction (no projection), same contract as
// lstm_persistent_backward: fills dG [N, G], hprev [N, H], grad_h0 and grad_c0 [B, H] (acc_t)
// from the saved gates [N, G], cells [N, H], y [N, H], grad_y [N, H], h0/c0 and
// grad_h_n/grad_c_n [B, H].
template <class scalar_t>
bool lstm_fused_backward(const LstmSizes& s, bool reverse, bool tf32, const scalar_t* w_hh, const scalar_t* gates,
                         const scalar_t* cells, const scalar_t* y, const scalar_t* grad_y, const scalar_t* h0,
                         const scalar_t* c0, const scalar_t* grad_h_n, const scalar_t* grad_c_n, scalar_t* dG,
                         scalar_t* hprev, at::opmath_type<scalar_t>* grad_h0, at::opmath_type<scalar_t>* grad_c0,
                         const at::Tensor& like);

}  // namespace cuda
}  // namespace seqkernels
