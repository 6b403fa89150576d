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
