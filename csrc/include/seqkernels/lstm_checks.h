// Input validation shared by the CPU and CUDA LSTM operators. Every check raises a Python
// exception through TORCH_CHECK before any data pointer is touched.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <vector>

namespace seqkernels {

// Sizes of one lstm_forward / lstm_backward call (shape legend in csrc/registration.cpp).
struct LstmSizes {
  int64_t T = 0;     // time steps
  int64_t N = 0;     // packed rows, sum(batch_sizes)
  int64_t B = 0;     // batch_sizes[0]
  int64_t I = 0;     // input features
  int64_t H = 0;     // hidden units
  int64_t P = 0;     // projection size, 0 without projection
  int64_t Hout = 0;  // P if projected else H: width of y, h0, h_n and of w_hh's rows
  int64_t G = 0;     // 4H gate rows
  bool has_bias = false;
  std::vector<int64_t> batch_sizes;  // host copy, T entries
  std::vector<int64_t> offsets;      // T + 1 entries: step t owns rows [offsets[t], offsets[t+1])
};

// A neighbour of step t in the forward's processing order (t = 0..T-1, or T-1..0 when
// reverse): rows [0, rows) of step t are the same sequences as rows [0, rows) of step t2,
// whose first packed row is `off`; rows = 0 at the ends. Batch sizes never grow with t, so
// going forward every row of t came from t-1 and the first batch_sizes[t+1] rows go on into
// t+1; in reverse the first batch_sizes[t+1] rows came from t+1 and every row goes on into t-1.
struct StepLink {
  int64_t rows = 0;
  int64_t off = 0;
};

// Whether every step has all B rows (no sequence ends early). Batch sizes never grow with t, so
// the last step decides.
inline bool all_steps_full(const LstmSizes& s) { return s.batch_sizes[s.T - 1] == s.B; }

// The step whose state step t starts from (its other rows start from h0 / c0).
inline StepLink previous_step(const LstmSizes& s, int64_t t, bool reverse) {
  if (!reverse && t > 0) return {s.batch_sizes[t], s.offsets[t - 1]};
  if (reverse && t + 1 < s.T) return {s.batch_sizes[t + 1], s.offsets[t + 1]};
  return {};
}

// The step that continues step t's state (its other rows end at t: h_n / c_n).
inline StepLink next_step(const LstmSizes& s, int64_t t, bool reverse) {
  if (!reverse && t + 1 < s.T) return {s.batch_sizes[t + 1], s.offsets[t + 1]};
  if (reverse && t > 0) return {s.batch_sizes[t], s.offsets[t - 1]};
  return {};
}

LstmSizes check_lstm_forward(const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                             const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                             const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh,
                             const std::optional<at::Tensor>& w_hr);

LstmSizes check_lstm_backward(const at::Tensor& grad_y, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                              const at::Tensor& x, const at::Tensor& batch_sizes, const at::Tensor& h0,
                              const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                              const std::optional<at::Tensor>& w_hr, const at::Tensor& y, const at::Tensor& gates,
                              const at::Tensor& cells, bool has_bias);

}  // namespace seqkernels
