// Input validation shared by the CPU and CUDA ConvRNN operators (convrnn_forward /
// convrnn_backward, schemas in csrc/registration.cpp). Every check raises a Python
// exception through TORCH_CHECK before any data pointer is touched.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace seqkernels {

// Sizes and flags of one convrnn_forward / convrnn_backward call.
// Shape legend: B batch, T steps, C channels, N ring size, K kernel width.
struct ConvRnnSizes {
  int64_t B = 0;  // batch
  int64_t T = 0;  // time steps
  int64_t C = 0;  // channels
  int64_t N = 0;  // ring size
  int64_t K = 0;  // kernel width
  bool has_bias = false;
  bool circular = true;  // padding_mode 0: circular; 1: zeros
  bool relu = false;     // nonlinearity 0: tanh; 1: relu
};

// x [B, T, C, N], weight [C, C, K], bias [C] or None, h0 [B, C, N]; all contiguous, on one
// device, one dtype of float32/float64/bfloat16/float16. padding_mode in {0, 1},
// nonlinearity in {0, 1}; circular padding needs K <= N.
ConvRnnSizes check_convrnn_forward(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                   const at::Tensor& h0, int64_t padding_mode, int64_t nonlinearity);

// grad_y [B, T, C, N], grad_h_T [B, C, N], weight [C, C, K], h0 [B, C, N], y [B, T, C, N];
// the same rules as check_convrnn_forward (sizes taken from y), except that grad_y and
// grad_h_T may have any strides.
ConvRnnSizes check_convrnn_backward(const at::Tensor& grad_y, const at::Tensor& grad_h_T, const at::Tensor& weight,
                                    const at::Tensor& h0, const at::Tensor& y, int64_t padding_mode,
                                    int64_t nonlinearity, bool has_bias);

}  // namespace seqkernels
